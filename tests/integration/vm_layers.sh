#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Layered suspends and resumes against the real RGW: a golden suspended whole; a VM resumed
# from it, dirtied inside the guest, suspended again: a delta over the set it came from (only
# the pages that changed), through a chain of 3; each set pulled back is byte-identical to the
# checkpoint that was pushed (md5 of every file), and every resumed guest's RAM blob has the md5
# it booted with. Resumes with the parent in the node's cache read it from there; one with an
# empty cache fetches every layer; an on-demand resume of a delta set; a suspend killed at its
# commit leaves the set it replaces whole and the VM's checkpoint local.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/integration/vm_lib.sh"
export VMSNAP_LAYOUT=layered
. "$VMSNAP_SRC/tests/integration/xfer_s3_lib.sh"
export AWS_ENDPOINT_URL AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
A=$T/node-a
B=$T/node-b
CA=$T/cache-a # each node's own object cache
CB=$T/cache-b
from_golden "$A"
VM_DIRS+=("$B")
S=s3://$BUCKET

# sums STATE NAME: md5 of every file of the VM's local checkpoint, "name md5" a line
sums() { (cd "$1/vms/$2/checkpoint" && md5sum -- * | awk '{print $2, $1}' | sort); }
# pulled_sums URL: the same for the set at URL, pulled with its own empty cache
pulled_sums() {
    rm -rf "$T/pulled" "$T/pcache"
    VMSNAP_CACHE_DIR=$T/pcache "$VMSNAP" -q pull "$1" "$T/pulled" || return 1
    (cd "$T/pulled" && md5sum -- * | awk '{print $2, $1}' | sort)
}
# chain URL FILE: the set's chain for FILE as "False,True,..."
chain() {
    OUT=$T/m.json s3curl GET "$BUCKET/${1#"$S"/}/manifest.json" >/dev/null
    jget "$T/m.json" '",".join(str(l["delta"]) for l in j["files"]["'"$2"'"]["layers"])'
}
# suspend_checked STATE NAME URL [FLAG...]: pause (a local checkpoint), note its sums, suspend
# (pushes that checkpoint), check the set pulled back has them; --json of the suspend in
# $T/susp.json, its stderr in $T/susp.err
suspend_checked() {
    VMSNAP_CACHE_DIR=$CA vmc "$1" pause "$2" >/dev/null || { fail "pause $2"; return 1; }
    sums "$1" "$2" >"$T/sums.want"
    vmc "$1" suspend "$2" "$3" --json "${@:4}" >"$T/susp.json" 2>"$T/susp.err" ||
        { fail "suspend $2 to $3: $(cat "$T/susp.err")"; return 1; }
    pulled_sums "$3" >"$T/sums.got" || { fail "pull $3"; return 1; }
    diff "$T/sums.want" "$T/sums.got" >&2 || fail "$3 pulled back differs from the checkpoint pushed"
}

resume_check "$A" golden "$golden_ram" "$golden_data" || done_tests
sleep 1
# the golden: a full layer of every file
suspend_checked "$A" golden "$S/g" || done_tests
[ "$(chain "$S/g" memory-ranges)" = False ] || fail "golden chain: $(chain "$S/g" memory-ranges)"
full=$(jget "$T/susp.json" 'j["object_bytes"]')
read -r r d <<<"$(last_counter "$A" golden)"

# resumed on node B (empty cache: every layer fetched), dirtied, suspended: a delta
export VMSNAP_CACHE_DIR=$CB
resume_check "$B" golden "$r" "$d" "$S/g" --json || done_tests
from=$(con_lines "$B" golden)
vmc "$B" console golden --send "dirty 4" || fail "dirty"
sleep 2
suspend_checked "$B" golden "$S/c1" || done_tests
[ "$(chain "$S/c1" memory-ranges)" = "False,True" ] || fail "c1 chain: $(chain "$S/c1" memory-ranges)"
[ "$(jget "$T/susp.json" 'j["deltas"] >= 1')" = True ] || fail "c1: $(cat "$T/susp.json")"
delta=$(jget "$T/susp.json" 'j["object_bytes"]')
[ "$delta" -lt "$((full / 2))" ] || fail "a delta of 4 MiB dirtied stored $delta bytes (full: $full)"
echo "golden $full bytes, delta after 4 MiB dirtied: $delta bytes" >&2
read -r r d <<<"$(last_counter "$B" golden)"

# resumed on B again (its cache holds the golden's layers): only the delta is fetched
vmc "$B" stop --rm golden >/dev/null 2>&1 || true
from=$(con_lines "$B" golden)
vmc "$B" resume golden "$S/c1" --json >"$T/r2.json" 2>"$T/r2.err" || fail "resume c1: $(cat "$T/r2.err")"
cached=$(jget "$T/r2.json" 'j.get("cached_bytes", 0)')
pulled=$(jget "$T/r2.json" 'j.get("object_bytes", 0)')
[ "$cached" -gt 0 ] && [ "$((pulled - cached))" -lt "$((full / 2))" ] ||
    fail "resume of c1 with the golden cached fetched $((pulled - cached)) of $pulled bytes"
wait_console "$B" golden "$from" 'vmsnap-counter' 60 || true
[ "$(blob_md5 "$B" golden)" = "$boot_md5" ] || fail "RAM blob md5 after a delta resume"

# a chain of 3: dirtied and suspended again over c1
vmc "$B" console golden --send "dirty 2" || fail "dirty"
sleep 2
suspend_checked "$B" golden "$S/c2" -v || done_tests
[ "$(chain "$S/c2" memory-ranges)" = "False,True,True" ] || fail "c2 chain: $(chain "$S/c2" memory-ranges)"
# the upper disk is layered the same way (a delta, unless its change comes out over 3/4 of its
# full image: then whole, and the suspend says so; the guest's writes to its disk grow with the
# time between the suspends, so on a slow machine that can happen)
case "$(chain "$S/c2" rootfs-disk-vda.ext4)" in
*True*) ;;
*) grep -q 'rootfs-disk-vda.ext4: a full layer (the delta is' "$T/susp.err" ||
    fail "the upper disk has no delta: $(chain "$S/c2" rootfs-disk-vda.ext4): $(cat "$T/susp.err")" ;;
esac
read -r r d <<<"$(last_counter "$B" golden)"

# on node A with an empty cache, on demand: every layer fetched, the guest goes on
export VMSNAP_CACHE_DIR=$T/cache-empty
vmc "$A" stop --rm golden >/dev/null 2>&1 || true
resume_check "$A" golden "$r" "$d" "$S/c2" --on-demand || done_tests
[ "$(blob_md5 "$A" golden)" = "$boot_md5" ] || fail "RAM blob md5 after an on-demand chain resume"
read -r r d <<<"$(last_counter "$A" golden)"

# a suspend killed at its commit: the set it replaces (c2) stays whole; the checkpoint is local
sleep 1
VMSNAP_FAILPOINT=layered-uploaded:stop "$VMSNAP" vm suspend golden "$S/c2" --state-dir "$A" \
    >/dev/null 2>&1 &
pid=$!
wait_stopped "$pid" 120 || fail "the suspend never reached its commit"
kill_wait "$pid"
[ "$(chain "$S/c2" memory-ranges)" = "False,True,True" ] || fail "a killed suspend changed c2"
pulled_sums "$S/c2" >/dev/null || fail "c2 does not pull after a killed suspend over it"
vmc "$A" ls | grep -Eq '^golden +(paused|interrupted|unsaved)' || fail "ls after a killed suspend: $(vmc "$A" ls)"
# the next resume (from what the node has) works without --force, and gc removes the junk
vmc "$A" resume golden >"$T/r3.out" 2>&1 || fail "resume after a killed suspend: $(cat "$T/r3.out")"
"$VMSNAP" -q gc --older-than 0 "$S" || fail "gc"
pulled_sums "$S/c1" >/dev/null && pulled_sums "$S/c2" >/dev/null && pulled_sums "$S/g" >/dev/null ||
    fail "gc broke a set"
done_tests
