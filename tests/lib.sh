# SPDX-License-Identifier: Apache-2.0
# Shared helpers for shell tests. Source it: . "$VMSNAP_SRC/tests/lib.sh"
set -euo pipefail
VMSNAP=${VMSNAP_BIN:?VMSNAP_BIN is set by ctest}
SRC=${VMSNAP_SRC:?}
T=$(mktemp -d "${TMPDIR:-/tmp}/vmsnap-sh.XXXXXX")

# Exit: the commands given to at_exit run in the order they were given (each whatever the
# others did), then t_cleanup removes $T. A script that mounts below $T unmounts in one: rm -rf
# would descend into the mount. t_cleanup may be redefined by a script's own library.
T_AT_EXIT=()
at_exit() { T_AT_EXIT+=("$1"); }
t_exit() {
    local h
    for h in ${T_AT_EXIT[@]+"${T_AT_EXIT[@]}"}; do
        eval "$h" || true
    done
    t_cleanup
}
trap 't_exit' EXIT
t_cleanup() { [ -n "${VMSNAP_KEEP_TMP:-}" ] || rm -rf "$T"; }

fails=0
T_FAILED=()
fail() {
    echo "FAIL: $*" >&2
    fails=$((fails + 1))
    T_FAILED+=("$*")
}
# the failures so far, one a line, after a count
t_report_failures() {
    local f
    echo "FAILED: $fails${1:+ $1}" >&2
    for f in "${T_FAILED[@]}"; do echo "  - $f" >&2; done
}
# skip REASON: the rest of the script cannot run here: exit 77. But exit 1 when a check failed
# before (a skip does not hide a failure: those are listed) or when VMSNAP_REQUIRE_ALL=1.
skip() {
    if [ "$fails" -ne 0 ]; then
        echo "SKIP (not taken: the checks before it failed): $*" >&2
        t_report_failures "(before the skip)"
        exit 1
    fi
    if [ "${VMSNAP_REQUIRE_ALL:-0}" = 1 ]; then echo "FAIL (skip not allowed): $*" >&2; exit 1; fi
    echo "SKIP: $*" >&2; exit 77
}
done_tests() {
    if [ "$fails" -ne 0 ]; then t_report_failures; exit 1; fi
    echo ok
}

# expect_fail DESC CMD...: the command must fail (exit 1, or 3-7: a class of failure of
# docs/cli.md; not 2, a usage error, nor a crash) and print an error to stderr
expect_fail() {
    local desc=$1; shift
    local rc=0
    "$@" >"$T/out" 2>"$T/err" || rc=$?
    case $rc in 1 | 3 | 4 | 5 | 6 | 7) ;; *) fail "$desc: exit $rc, expected a failure (1, 3-7) ($(head -c 300 "$T/err"))"; return ;; esac
    [ -s "$T/err" ] || fail "$desc: no error message"
}

# wait_for SECONDS CMD...: run CMD every 0.05 s until it succeeds; status 1 if it did not
# within SECONDS (a whole number). CMD may be a function of the script's.
wait_for() {
    local i n=$(($1 * 20))
    shift
    for ((i = 0; i < n; i++)); do
        "$@" && return 0
        sleep 0.05
    done
    return 1
}
# not CMD...: CMD's status inverted (for wait_for: wait until CMD fails)
not() { ! "$@"; }
# A script's background job has SIGINT ignored (POSIX, without job control), and vmsnap keeps a
# signal it inherits as ignored, as nohup wants. A test standing for a terminal's Ctrl-C (which
# reaches a foreground job) starts the job as `env --default-signal=INT CMD &` (a simple
# command, so that $! is CMD itself).
# stopped PID: PID is stopped (a VMSNAP_FAILPOINT=NAME:stop reached)
stopped() { [ "$(ps -o stat= -p "$1" | cut -c1)" = T ]; }
# wait_stopped PID [SECONDS]: wait (default 60 s) until PID is stopped; status 1 if it never was
wait_stopped() { wait_for "${2:-60}" stopped "$1"; }
# kill_wait PID [SIGNAL]: send SIGNAL (default KILL) to PID and reap it, whatever its status
kill_wait() {
    kill -"${2:-KILL}" "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}
# interrupt SIGNAL SECONDS CMD...: run CMD as a job that takes SIGINT (a Ctrl-C's), its stderr in
# $T/err, send it SIGNAL after SECONDS; its exit status in $irc
interrupt() {
    env --default-signal=INT "${@:3}" 2>"$T/err" &
    local pid=$!
    sleep "$2"
    kill -"$1" "$pid" 2>/dev/null || true
    irc=0 && wait "$pid" || irc=$?
}

# mk FILE BYTES: random, incompressible data (an object's size is then about the input's)
mk() { head -c "$2" /dev/urandom >"$1"; }
# allocated FILE: the bytes FILE has allocated on its filesystem
allocated() { echo $(($(stat -c %b "$1") * 512)); }
# jget FILE EXPR: print the Python expression EXPR over `j`, the JSON in FILE (- for stdin)
jget() {
    python3 -c 'import json, sys
j = json.load(sys.stdin if sys.argv[1] == "-" else open(sys.argv[1]))
print(eval(sys.argv[2]))' "$1" "$2"
}
# Pages of the files under the given paths that are in the page cache (vmsnap cache stat).
cached_pages() {
    "$VMSNAP" cache stat --json "$@" | jget - 'j["total"]["cached"]'
}
