#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The CLI's client mode (--socket PATH, VMSNAP_SOCKET): the same commands run once by the CLI
# itself and once through vmsnapd, in the same directory (moved away between the runs), and
# their stdout, stderr and exit codes compared, text and --json: sets on the local store (push,
# push over a base, ls, pull, a pull refused over existing files, a pull and an rm of what is
# not there, rm) and a real guest's life (vm run, ls, pause, resume, suspend to the local store,
# resume from it, stop, stop --rm, a pause of no VM). What differs by nature is masked: seconds,
# rates and CPU seconds everywhere; in the VM part also process ids and the memory image's
# byte counts (the guest runs on between the runs). Options the daemon's configuration decides
# are refused through it as usage errors (exit 2).
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/integration/vm_lib.sh"
. "$VMSNAP_SRC/tests/integration/daemon_lib.sh"
G=$(guest_dir)
W=$T/w
M=$((1 << 20))

# norm MODE: the output on stdin with what differs between two runs masked
norm() {
    python3 -c '
import json, re, sys
vm = sys.argv[1] == "vm"
MASK = {"seconds", "cpu_seconds"} | ({"pid", "busy_pid", "object_bytes", "copied_bytes",
                                      "cached_bytes", "deltas"} if vm else set())
def walk(v):
    if isinstance(v, dict):
        return {k: (0 if k in MASK and v[k] is not None else
                    {s: 0 for s in v[k]} if k == "steps" else walk(x)) for k, x in v.items()}
    if isinstance(v, list):
        return [walk(x) for x in v]
    return v
for line in sys.stdin:
    line = line.rstrip("\n")
    try:
        print(json.dumps(walk(json.loads(line)), sort_keys=True))
        continue
    except ValueError:
        pass
    line = re.sub(r"[0-9]+\.[0-9]+ s\b", "T s", line)
    line = re.sub(r"\([^()]*/s of object bytes\)", "(R)", line)
    line = re.sub(r"[0-9.]+ CPU s", "C CPU s", line)
    if vm:
        line = re.sub(r"^(\S+ +\S+ +)[0-9]+ +", r"\1P ", line)
        line = re.sub(r"object bytes [0-9.]+ [KMGT]?i?B", "object bytes N", line)
    print(line)' "$1"
}

# step MODE CMD...: run one command of the sequence; its masked output and exit code recorded
# in $W.log (out of the directory the commands work in)
step() {
    local mode=$1 rc=0
    shift
    "$VMSNAP" "$@" >"$T/o" 2>"$T/e" || rc=$?
    {
        echo "== $* -> $rc"
        norm "$mode" <"$T/o"
        echo "-- stderr"
        norm "$mode" <"$T/e"
    } >>"$LOG"
}

sets_flow() {
    mkdir -p "$W/set" "$W/store"
    head -c $((2 * M)) "$T/seed" >"$W/set/memory-ranges"
    truncate -s $((24 * M)) "$W/set/memory-ranges"
    echo '{"state": 1}' >"$W/set/state.json"
    step sets push "$W/set" "$W/store/a"
    printf 'changed' | dd of="$W/set/memory-ranges" bs=1 seek=8192 conv=notrunc status=none
    step sets push --json --base "$W/store/a" "$W/set" "$W/store/b"
    step sets ls "$W/store"
    step sets ls --json "$W/store/"
    step sets pull "$W/store/a" "$W/out-a"
    step sets pull --json "$W/store/b" "$W/out-b"
    step sets pull "$W/store/a" "$W/out-a"
    step sets pull --json "$W/store/b" "$W/out-b"
    step sets pull "$W/store/nope" "$W/out-x"
    step sets pull --json "$W/store/nope" "$W/out-x"
    step sets -q push "$W/set" "$W/store/c"
    step sets rm "$W/store/a"
    step sets rm --json "$W/store/b"
    step sets rm "$W/store/a"
    step sets rm --json "$W/store/nope"
    step sets ls --json "$W/store"
    cmp "$W/set/memory-ranges" "$W/out-b/memory-ranges" >>"$LOG" 2>&1 || echo "out-b differs" >>"$LOG"
}

vm_flow() {
    mkdir -p "$W/state" "$W/store"
    step vm vm run g1 --kernel "$G/vmlinux" --initrd "$G/initrd.cpio.gz" --mem "$VM_MEM" \
        --disk-size 64M --append "$(cat "$G/cmdline") vmsnap.dirty=4"
    wait_console "$W/state" g1 0 'vmsnap-counter ram=2 ' 120 || return 1
    step vm vm ls
    step vm vm pause g1
    step vm vm ls --json
    step vm vm resume g1 --json
    step vm vm suspend g1 "$W/store/vm"
    step vm vm ls
    step vm vm resume g1 "$W/store/vm" --json
    step vm vm stop g1
    step vm vm ls --json
    step vm vm stop --rm g1 --json
    step vm vm pause nosuch
    step vm vm pause nosuch --json
    step vm vm ls
}

head -c $((2 * M)) /dev/urandom >"$T/seed"
VM_DIRS+=("$W/state")

# the CLI itself: the library's defaults from the environment
export VMSNAP_STATE_DIR=$W/state VMSNAP_CACHE_DIR=$W/cache
LOG=$T/direct.log
: >"$LOG"
sets_flow
vm_flow || done_tests
mv "$W" "$T/w.direct"

# through the daemon, configured with the same directories; the CLI's environment says nothing
daemon_start --set "root=$T" --set "asset_dir=$G" --set "state_dir=$W/state" \
    --set "ram_dir=$VMSNAP_RAM_DIR" --set "cache_dir=$W/cache" || done_tests
unset VMSNAP_STATE_DIR VMSNAP_CACHE_DIR
export VMSNAP_SOCKET=$DSOCK
LOG=$T/client.log
: >"$LOG"
sets_flow
# the console is read in this process: the state directory is the same
VMSNAP_STATE_DIR=$W/state vm_flow || done_tests

if ! diff -u "$T/direct.log" "$T/client.log" >"$T/diff"; then
    fail "the outputs through the daemon differ from the CLI's own: $(head -c 6000 "$T/diff")"
fi
# what the daemon did is real: the pulled files are the pushed ones
cmp "$T/w.direct/out-b/memory-ranges" "$W/out-b/memory-ranges" || fail "the pulled files differ"
grep -q '^== push .* -> 0$' "$T/client.log" || fail "no push through the daemon succeeded"
grep -q '^== vm resume g1 .*/store/vm --json -> 0$' "$T/client.log" ||
    fail "the resume from the store through the daemon failed: $(cat "$T/client.log")"
[ "$(grep -c -- '-> 3$' "$T/client.log")" -ge 4 ] || fail "the not-found cases did not exit 3"
# --socket itself (over VMSNAP_SOCKET), and what the daemon does not take: a usage error
unset VMSNAP_SOCKET
"$VMSNAP" --socket "$DSOCK" ls --json "$W/store" >"$T/o" || fail "--socket PATH ls"
[ "$(jget "$T/o" '[s["url"] for s in j["sets"]]')" = "['$W/store/c', '$W/store/vm']" ] || fail "--socket ls: $(cat "$T/o")"
rc=0
"$VMSNAP" --socket="$DSOCK" push -j 4 "$W/set" "$W/store/d" 2>"$T/e" || rc=$?
[ "$rc" = 2 ] && grep -q 'not through the daemon' "$T/e" || fail "push -j through the daemon: $rc $(cat "$T/e")"
rc=0
"$VMSNAP" --socket "$T/no-daemon.sock" ls "$W/store" 2>"$T/e" || rc=$?
[ "$rc" = 5 ] && grep -q "no-daemon.sock" "$T/e" || fail "no daemon at the socket: exit $rc $(cat "$T/e")"
daemon_stop || fail "vmsnapd did not stop cleanly"
done_tests
