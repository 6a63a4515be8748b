#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The CLI's client mode (--socket PATH, VMSNAP_SOCKET): the same commands run once by the CLI
# itself and once through vmsnapd, in the same directory (moved away between the runs), and
# their stdout, stderr and exit codes compared, text and --json: sets on the local store (push,
# push over a base, ls, pull, a pull refused over existing files, a pull and an rm of what is
# not there, rm) and a real guest's life (vm run, ls, pause, resume, suspend to the local store,
# resume from it, stop, stop --rm, a pause of no VM); gc (dry run, verbose, --json) over a push
# killed in its PUT (an old unfinished upload) and one killed after its mark (a young mark kept,
# then cleaned with --older-than 0), export (and of no set); disk create (seeded with --add and
# --mkdir, over an existing image without -f), clone (onto an existing one, of no image), info;
# cache stat, evict (--staged, --preserve), objects and trim over a cache laid out with fixed
# times, each also of a path that is not there. What differs by nature is masked: seconds,
# rates and CPU seconds everywhere; ages in seconds, push marks' ids, file system times; the page
# counts of the page cache (what the kernel holds between two runs); in the VM part also process
# ids and the memory image's byte counts (the guest runs on between the runs). The library's
# log lines (-v) are the daemon's through it, left out. Options the
# daemon's configuration decides are refused through it as usage errors (exit 2).
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/integration/vm_lib.sh"
. "$VMSNAP_SRC/tests/integration/daemon_lib.sh"
G=$(guest_dir)
W=$T/w
M=$((1 << 20))

# norm MODE: the output on stdin with what differs between two runs masked
norm() {
    python3 -c '
import json, re, sys
vm, pc = sys.argv[1] == "vm", sys.argv[1] == "pcache"
MASK = {"seconds", "cpu_seconds", "age_seconds", "mkfs_time", "write_time"} | (
    {"pid", "busy_pid", "object_bytes", "copied_bytes", "cached_bytes", "deltas"} if vm else
    set()) | ({"cached", "dirty", "writeback", "evicted", "recently_evicted", "dropped_pages",
               "dropped_bytes", "dropped_files", "removed_pages"} if pc else set())
def walk(v):
    if isinstance(v, dict):
        return {k: (0 if k in MASK and v[k] is not None else
                    {s: 0 for s in v[k]} if k == "steps" else walk(x)) for k, x in v.items()}
    if isinstance(v, list):
        return [walk(x) for x in v]
    return v
for line in sys.stdin:
    line = line.rstrip("\n")
    if line.startswith(("vmsnap: info: ", "vmsnap: debug: ")):
        continue  # the library logs in the process that calls it: through the daemon, its own
    try:
        print(re.sub(r"vmsnap-push-[0-9a-f]{32}", "vmsnap-push-ID",
                     json.dumps(walk(json.loads(line)), sort_keys=True)))
        continue
    except ValueError:
        pass
    line = re.sub(r"vmsnap-push-[0-9a-f]{32}", "vmsnap-push-ID", line)  # a push mark
    line = re.sub(r"\b[0-9]+ s old", "S s old", line)  # gc: the age of a young mark
    line = re.sub(r"[0-9]+\.[0-9]+ s\b", "T s", line)
    line = re.sub(r"\([^()]*/s of object bytes\)", "(R)", line)
    line = re.sub(r"[0-9.]+ CPU s", "C CPU s", line)
    if pc:  # cache stat: the columns CACHED to RECENT; evict: what it dropped
        line = re.sub(r"^( *[0-9.]+ \S+ +[0-9]+ +)[0-9]+ +[0-9.]+% +(?:[0-9-]+ +){4}", r"\1N ", line)
        line = re.sub(r"^dropped: .*", "dropped: N", line)
        line = re.sub(r"[0-9]+ pages cached", "N pages cached", line)
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

# a store where pushes were killed: an unfinished upload (its PUT's temporary) days old, and the
# mark and objects of a set push killed after marking, young (kept by gc's default --older-than)
gc_flow() {
    mkdir -p "$W/gcs/puts"
    echo small >"$W/small"
    env -u VMSNAP_SOCKET VMSNAP_FAILPOINT=local-put-written "$VMSNAP" -q push "$W/small" \
        "$W/gcs/puts/obj.zstd" 2>/dev/null && echo "the push to be killed in its PUT was not" >>"$LOG"
    touch -d '3 days ago' "$W"/gcs/puts/.obj.zstd.mpu-*
    env -u VMSNAP_SOCKET VMSNAP_LAYOUT=reference VMSNAP_FAILPOINT=push-marked "$VMSNAP" -q push \
        "$W/set" "$W/gcs/k" \
        2>/dev/null && echo "the set push to be killed was not" >>"$LOG"
    step sets gc --dry-run "$W/gcs"
    step sets gc --json --dry-run "$W/gcs"
    step sets -v gc "$W/gcs"
    step sets gc --json --dry-run --older-than 0 "$W/gcs"
    step sets gc --older-than 0 "$W/gcs"
    step sets gc --json "$W/gcs"
    step sets gc --json "$W/nope"
    ls -A "$W/gcs" >>"$LOG"
    step sets export "$W/store/c" "$W/store/ex"
    step sets export --json --level 3 "$W/store/c" "$W/store/ex2"
    step sets export "$W/store/nope" "$W/store/ex3"
    step sets export --json "$W/store/nope" "$W/store/ex3"
    step sets ls --json "$W/store"
}

disk_flow() {
    mkdir -p "$W/tree/d"
    echo seed >"$W/tree/d/f"
    local u=--uuid=6c1f5ae1-2b7e-4a41-9a62-0f8de1c0a001
    step sets disk create --size 64M "$u" --label upper "$W/d1.img"
    step sets disk create --json --size 32M --inodes 2048 "$u" --from-dir "$W/tree" \
        --add "$W/set/state.json:/etc/state.json:0640:1:2" --mkdir /var/x:0700 "$W/d2.img"
    step sets disk create --size 64M "$W/d1.img"
    step sets disk create --json --size 64M "$W/d1.img"
    step sets disk create --json -f --fsync --size 16M "$u" "$W/d1.img"
    step sets disk create --size 16M --from-dir "$W/nope" "$W/d3.img"
    step sets disk info "$W/d2.img"
    step sets disk info --json "$W/d1.img"
    step sets disk info "$W/nope.img"
    step sets disk info --json "$W/nope.img"
    step sets disk info "$W/set/state.json"
    step sets disk clone "$W/d2.img" "$W/c2.img"
    step sets disk clone --json --link "$W/d2.img" "$W/c3.img"
    step sets disk clone "$W/d2.img" "$W/c2.img"
    step sets disk clone --json "$W/d2.img" "$W/c2.img"
    step sets disk clone --json -f --new-uuid "$W/d2.img" "$W/c2.img"
    step sets disk clone "$W/nope.img" "$W/c4.img"
    step sets disk info --json "$W/c3.img"
}

# the page cache of files laid out here, and the object cache (its entries laid out as
# docs/objcache.md says, with fixed times)
cache_flow() {
    mkdir -p "$W/pc/keep" "$W/cache/objects"
    head -c $((3 * M)) "$T/seed" >"$W/pc/a"
    head -c 5000 "$T/seed" >"$W/pc/keep/b"
    cp "$W/pc/a" "$W/pc/staged"
    sync
    step pcache cache stat "$W/pc"
    step pcache cache stat --json "$W/pc/a" "$W/pc/keep"
    step pcache cache stat "$W/pc/a" "$W/nope"
    step pcache cache stat --json "$W/nope"
    step pcache cache evict "$W/pc/a"
    step pcache cache evict --json "$W/pc/a" "$W/pc/keep"
    step pcache cache evict --json --staged --preserve "$W/pc/keep" --preserve "$W/pc/a" "$W/pc"
    step pcache cache evict "$W/nope"
    step pcache cache evict --json "$W/nope"
    ls -A "$W/pc" >>"$LOG"
    local k i=0
    for k in t-a t-b t-c t-d; do
        i=$((i + 1))
        head -c $((i * 1024)) "$T/seed" >"$W/cache/objects/$k"
        chmod 0400 "$W/cache/objects/$k"
    done
    touch -m -d @1700000300 "$W/cache/objects/t-a"
    touch -m -d @1700000100 "$W/cache/objects/t-b"
    touch -m -d @1700000400 "$W/cache/objects/t-c"
    touch -m -d @1700000200 "$W/cache/objects/t-d"
    step sets cache objects
    step sets cache objects --json
    step sets cache trim --json --max-size 8K
    step sets cache trim
    step sets cache trim --max-size 3K
    step sets cache objects --json
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
gc_flow
disk_flow
cache_flow
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
gc_flow
disk_flow
cache_flow
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
[ "$(grep -c -- '-> 3$' "$T/client.log")" -ge 14 ] || fail "the not-found cases did not exit 3"
[ "$(grep -c -- '^== disk c.* -> 1$' "$T/client.log")" -ge 4 ] || fail "the existing destinations did not exit 1"
for v in 'gc --json --dry-run --older-than 0' 'export --json --level 3' 'disk create --json --size 32M' \
    'disk clone --json --link' 'cache stat --json' 'cache evict --json --staged' \
    'cache trim --json' 'cache objects --json'; do
    grep -q -- "^== $v.* -> 0\$" "$T/client.log" || fail "'$v' through the daemon did not succeed"
done
# each verb went to the daemon (a CLI running it itself prints the same)
for p in /v1/sets/gc /v1/sets/export /v1/disks/create /v1/disks/clone /v1/disks/info \
    /v1/pcache/stat /v1/pcache/evict /v1/objcache /v1/objcache/trim; do
    grep -q "\"path\":\"$p[\"?]" "$DLOG" || fail "no request to $p in the daemon's log"
done
# what the daemon did is real: the items gc found, the image seeded, the cache trimmed
grep -q '"action": "abort", "age_seconds": 0, "kind": "upload"' "$T/client.log" ||
    fail "gc through the daemon did not report the old upload: $(grep -A2 '^== gc --json --dry-run' "$T/client.log")"
[ "$W/c3.img" -ef "$W/d2.img" ] || fail "clone --link through the daemon made no link"
debugfs -R 'cat /etc/state.json' "$W/d2.img" 2>/dev/null | cmp - "$W/set/state.json" ||
    fail "the image created through the daemon lacks its --add file"
[ "$(ls "$W/cache/objects")" = "t-c" ] || fail "trim through the daemon left: $(ls "$W/cache/objects")"
# --socket itself (over VMSNAP_SOCKET), and what the daemon does not take: a usage error
unset VMSNAP_SOCKET
"$VMSNAP" --socket "$DSOCK" ls --json "$W/store" >"$T/o" || fail "--socket PATH ls"
[ "$(jget "$T/o" '[s["url"] for s in j["sets"]]')" = "['$W/store/c', '$W/store/ex', '$W/store/ex2', '$W/store/vm']" ] || fail "--socket ls: $(cat "$T/o")"
rc=0
"$VMSNAP" --socket="$DSOCK" push -j 4 "$W/set" "$W/store/d" 2>"$T/e" || rc=$?
[ "$rc" = 2 ] && grep -q 'not through the daemon' "$T/e" || fail "push -j through the daemon: $rc $(cat "$T/e")"
for c in "cache evict --wait 2 $W/pc/a" "cache objects --cache-dir $W/cache" \
    "cache trim --cache-size 1G" "gc --endpoint http://127.0.0.1:1 $W/gcs"; do
    rc=0
    "$VMSNAP" --socket "$DSOCK" $c 2>"$T/e" || rc=$?
    [ "$rc" = 2 ] && grep -q 'not through the daemon' "$T/e" || fail "$c through the daemon: $rc $(cat "$T/e")"
done
# the VM verbs' store options: the node's profile names the store (exit 1, the option named)
for c in "suspend nosuch $W/store/v --endpoint http://127.0.0.1:1" "resume nosuch --retries 0"; do
    rc=0
    "$VMSNAP" --socket "$DSOCK" vm $c 2>"$T/e" || rc=$?
    o=${c##* --}
    [ "$rc" = 1 ] && grep -q -- "--${o%% *}.*not through the daemon" "$T/e" ||
        fail "vm $c through the daemon: $rc $(cat "$T/e")"
done
rc=0
"$VMSNAP" --socket "$T/no-daemon.sock" ls "$W/store" 2>"$T/e" || rc=$?
[ "$rc" = 5 ] && grep -q "no-daemon.sock" "$T/e" || fail "no daemon at the socket: exit $rc $(cat "$T/e")"
daemon_stop || fail "vmsnapd did not stop cleanly"
done_tests
