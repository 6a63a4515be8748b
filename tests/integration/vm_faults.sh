#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Faults: QEMU killed mid-run (vm ls shows it dead, resume from the last checkpoint works); a
# suspend whose upload fails keeps the local checkpoint and says so (a later suspend succeeds);
# a corrupted object in the store makes resume refuse, naming the object, with the snapshot
# untouched and nothing left on the resuming node.
. "$VMSNAP_SRC/tests/integration/vm_lib.sh"
S=$T/state
from_golden "$S"
resume_check "$S" golden "$golden_ram" "$golden_data" || done_tests
sleep 4 # run past the window resume_check accepts, so going back to the golden is visible
read -r r _ <<<"$(last_counter "$S" golden)"
[ "$r" -gt "$((golden_ram + 2))" ] || fail "the guest did not run on before the kill (ram $r)"
pid=$(cat "$S/vms/golden/pid")
kill -9 "$pid"
for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
sleep 0.5
vmc "$S" ls | grep -Eq '^golden +dead' || fail "vm ls after kill -9: $(vmc "$S" ls)"
expect_fail "pause of a dead VM" vmc "$S" pause golden
grep -q 'last checkpoint' "$T/err" || fail "pause of a dead VM: $(cat "$T/err")"
# resume goes back to the golden checkpoint: the counters continue from there, not from later
resume_check "$S" golden "$golden_ram" "$golden_data" || done_tests
[ "$(blob_md5 "$S" golden)" = "$boot_md5" ] || fail "RAM blob md5 after resume of a killed VM"
expect_fail "resume of a running VM" vmc "$S" resume golden
grep -q 'running' "$T/err" || fail "resume of a running VM: $(cat "$T/err")"

# upload fails (the store path is under a regular file): the checkpoint is kept locally
sleep 1
touch "$T/notadir"
expect_fail "suspend to an unwritable store" vmc "$S" suspend golden "$T/notadir/set"
grep -q 'kept locally' "$T/err" || fail "failed suspend does not say the checkpoint is kept: $(cat "$T/err")"
[ -f "$S/vms/golden/checkpoint/memory-ranges" ] && [ -f "$S/vms/golden/checkpoint/state" ] ||
    fail "failed suspend lost the local checkpoint"
vmc "$S" ls | grep -Eq '^golden +paused .*checkpoint' || fail "ls after failed suspend: $(vmc "$S" ls)"
read -r r d <<<"$(last_counter "$S" golden)"
resume_check "$S" golden "$r" "$d" || done_tests

# a later suspend succeeds; then corrupt one object and resume elsewhere
sleep 1
STORE=$T/store
vmc "$S" suspend golden "$STORE/set" || fail "suspend after a failed one"
obj=$STORE/set/memory-ranges.zstd
size=$(stat -c %s "$obj")
printf '\xff\xff\xff\xff' | dd of="$obj" bs=1 seek=$((size / 2)) conv=notrunc status=none
(cd "$STORE/set" && md5sum ./*) >"$T/store.md5"
B=$T/node-b
VM_DIRS+=("$B")
expect_fail "resume from a corrupted snapshot" vmc "$B" resume golden "$STORE/set"
grep -q 'memory-ranges' "$T/err" || fail "corruption error does not name the object: $(cat "$T/err")"
(cd "$STORE/set" && md5sum -c --quiet "$T/store.md5") || fail "resume modified the snapshot"
[ -z "$(vmc "$B" ls | tail -n +2)" ] || fail "failed resume left a VM record: $(vmc "$B" ls)"
ls "$VMSNAP_RAM_DIR" | grep -q 'golden\.\(stage\|ram\)' && fail "failed resume left files on tmpfs"
done_tests
