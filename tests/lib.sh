# SPDX-License-Identifier: Apache-2.0
# Shared helpers for shell tests. Source it: . "$VMSNAP_SRC/tests/lib.sh"
set -euo pipefail
VMSNAP=${VMSNAP_BIN:?VMSNAP_BIN is set by ctest}
SRC=${VMSNAP_SRC:?}
T=$(mktemp -d "${TMPDIR:-/tmp}/vmsnap-sh.XXXXXX")
trap 't_cleanup' EXIT
t_cleanup() { [ -n "${VMSNAP_KEEP_TMP:-}" ] || rm -rf "$T"; }
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
# skip REASON: exit 77, or 1 when VMSNAP_REQUIRE_ALL=1
skip() {
    if [ "${VMSNAP_REQUIRE_ALL:-0}" = 1 ]; then echo "FAIL (skip not allowed): $*" >&2; exit 1; fi
    echo "SKIP: $*" >&2; exit 77
}
# expect_fail DESC CMD...: the command must exit 1 and print an error to stderr
expect_fail() {
    local desc=$1; shift
    local rc=0
    "$@" >"$T/out" 2>"$T/err" || rc=$?
    if [ "$rc" != 1 ]; then fail "$desc: exit $rc, expected 1 ($(head -c 300 "$T/err"))"; return; fi
    [ -s "$T/err" ] || fail "$desc: no error message"
}
# A script's background job has SIGINT ignored (POSIX, without job control), and vmsnap keeps a
# signal it inherits as ignored, as nohup wants. A test standing for a terminal's Ctrl-C (which
# reaches a foreground job) starts the job as `env --default-signal=INT CMD &` (a simple
# command, so that $! is CMD itself).
# wait_stopped PID [SECONDS]: wait (default 60 s) until PID is stopped (a VMSNAP_FAILPOINT=
# NAME:stop reached); status 1 if it never was
wait_stopped() {
    for _ in $(seq 1 $((${2:-60} * 20))); do
        [ "$(ps -o stat= -p "$1" | cut -c1)" = T ] && return 0
        sleep 0.05
    done
    return 1
}
done_tests() {
    if [ "$fails" -ne 0 ]; then echo "FAILED: $fails" >&2; exit 1; fi
    echo ok
}
# Pages of the files under the given paths that are in the page cache (vmsnap cache stat).
cached_pages() {
    "$VMSNAP" cache stat --json "$@" | python3 -c 'import json,sys; print(json.load(sys.stdin)["total"]["cached"])'
}
