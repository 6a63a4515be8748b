#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# A pause whose checkpoint cannot be written after QEMU stopped (the state directory's filesystem
# is full: a real ENOSPC, on a small tmpfs): the VM's newest state (the device state in
# checkpoint.new, the RAM file, the live disk) is kept, `vm ls` says so, a resume or suspend
# refuses to go past it and names the cause, a stop keeps it; once there is room the next resume
# completes the checkpoint and the guest continues from the pause. `resume --force` discards it
# and resumes the previous checkpoint. And a suspend whose stage cannot be written on the RAM
# directory after QEMU stopped (out of inodes there): the checkpoint is kept locally instead and
# the record says paused. And the state directory filling up under a running guest: QEMU stops
# it on the failed disk write (io-error); resume continues it once there is room, a pause
# checkpoints it as it is. And a RAM directory without room for the guest's memory to grow
# (the guest would die of SIGBUS): run and resume refuse before QEMU starts.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/integration/vm_lib.sh"
[ "$(id -u)" = 0 ] || skip "mounting a small tmpfs needs root"
[ -f "$GOLDEN/golden.env" ] || skip "no golden checkpoint (vm_golden did not run or failed)"
F=$(mktemp -d "${TMPDIR:-/tmp}/vmsnap-full.XXXXXX")
R=$(mktemp -d "${TMPDIR:-/tmp}/vmsnap-fullram.XXXXXX")
# (after vm_lib's handler has stopped the VMs that use them)
at_exit 'umount "$F" "$R" 2>/dev/null || true; rmdir "$F" "$R" 2>/dev/null || true'
kib() { du -sk "$1" | cut -f1; }
g=$GOLDEN/state/vms/golden/checkpoint
ram_k=$(kib "$g/memory-ranges")
# room for the golden state directory and the live disk cloned out of it, and half a RAM image:
# the first resume fits, a pause's copy of the RAM (at least the golden's) does not
size_k=$(($(kib "$GOLDEN/state") + $(kib "$g/rootfs-disk-vda.ext4") + ram_k / 2))
mount -t tmpfs -o "size=${size_k}k,mode=0700" vmsnap-test-full "$F" ||
    skip "cannot mount a tmpfs on $F"
S=$F/state
from_golden "$S"
resume_check "$S" golden "$golden_ram" "$golden_data" || done_tests
sleep 3

expect_fail "pause into a full state directory" vmc "$S" pause golden
grep -q "No space left on device" "$T/err" || fail "pause into a full directory: $(cat "$T/err")"
grep -q "kept in $S/vms/golden/checkpoint.new" "$T/err" ||
    fail "the failed pause does not say where the VM's state is: $(cat "$T/err")"
read -r r d <<<"$(last_counter "$S" golden)"
[ -e "$S/vms/golden/checkpoint.new/state" ] || fail "the failed pause deleted the device state it took"
vmc "$S" ls | grep -Eq '^golden +interrupted' || fail "vm ls after the failed pause: $(vmc "$S" ls)"

expect_fail "resume while the pause's checkpoint cannot be completed" vmc "$S" resume golden
grep -q "could not be completed (.*No space left on device" "$T/err" ||
    fail "resume past an interrupted pause: $(cat "$T/err")"
expect_fail "suspend while the pause's checkpoint cannot be completed" \
    vmc "$S" suspend golden "$T/store/x"
grep -q "could not be completed" "$T/err" || fail "suspend past an interrupted pause: $(cat "$T/err")"
[ -e "$T/store/x" ] && fail "suspend pushed the older checkpoint over the VM's newer state"
vmc "$S" stop golden 2>"$T/err" || fail "vm stop: $(cat "$T/err")"
grep -q "keeping" "$T/err" || fail "vm stop does not say it keeps the VM's state: $(cat "$T/err")"
vmc "$S" ls | grep -Eq '^golden +interrupted' || fail "vm ls after vm stop: $(vmc "$S" ls)"

# room again: the resume completes the checkpoint, then restores it (the guest goes on from the
# pause, not from the golden)
mount -o remount,size=$((size_k + 4 * ram_k))k "$F"
resume_check "$S" golden "$r" "$d" || done_tests
grep -q "completed the checkpoint in .*checkpoint.new" "$T/resume.out" ||
    fail "resume did not complete the interrupted checkpoint: $(cat "$T/resume.out")"
[ -e "$S/vms/golden/checkpoint.new" ] && fail "checkpoint.new outlived its completion"

# full again: --force discards the state the failed pause took and resumes the checkpoint
# completed above (the RAM counter continues from r, not from the discarded pause)
sleep 3
used_k=$(df -k --output=used "$F" | tail -n1 | tr -d ' ')
mount -o remount,size=$((used_k + ram_k / 2))k "$F"
expect_fail "second pause into a full state directory" vmc "$S" pause golden
[ -d "$S/vms/golden/checkpoint.new" ] || fail "the second failed pause left no checkpoint.new"
resume_check "$S" golden "$r" "$d" --force || done_tests
grep -q "discarding the incomplete state" "$T/resume.out" ||
    fail "resume --force does not say it discards the state: $(cat "$T/resume.out")"
[ -e "$S/vms/golden/checkpoint.new" ] && fail "resume --force kept the discarded state"
vmc "$S" ls | grep -Eq '^golden +running' || fail "vm ls after resume --force: $(vmc "$S" ls)"

# a suspend whose stage on the RAM directory runs out of inodes after QEMU stopped
mount -o remount,size=$((size_k + 4 * ram_k))k "$F"
vmc "$S" pause golden || fail "pause before moving the VM to another RAM directory"
mount -t tmpfs -o size=1g,mode=0700 vmsnap-test-fullram "$R" || fail "mount the RAM tmpfs"
export VMSNAP_RAM_DIR=$R
read -r r d <<<"$(last_counter "$S" golden)"
resume_check "$S" golden "$r" "$d" || done_tests
sleep 2
used=$(df --output=iused "$R" | tail -n1 | tr -d " ")
# room for the stage directory, the device state, the config and the taking mark: the stop
# happens, the rest of the stage does not fit
mount -o remount,nr_inodes=$((used + 4)) "$R"
expect_fail "suspend whose stage runs out of inodes" vmc "$S" suspend golden "$T/store/y"
grep -q "the VM is stopped with a local checkpoint in $S/vms/golden/checkpoint: .*No space left" \
    "$T/err" || fail "stage out of inodes: $(cat "$T/err")"
[ -e "$T/store/y" ] && fail "stage out of inodes: something was pushed"
vmc "$S" ls | grep -Eq '^golden +paused' || fail "vm ls after the local checkpoint: $(vmc "$S" ls)"
read -r r d <<<"$(last_counter "$S" golden)"
mount -o remount,nr_inodes=100000 "$R"
resume_check "$S" golden "$r" "$d" || done_tests

# the disk's filesystem fills up under the running guest
wait_status() { # STATUS SECONDS
    local i
    for ((i = 0; i < $2 * 5; i++)); do
        vmc "$S" ls | grep -Eq "^golden +$1 " && return 0
        sleep 0.2
    done
    return 1
}
# continued FROM_LINE RAM DATA: the guest prints counters past RAM and DATA after FROM_LINE (the
# console log could not grow while the disk was full: RAM is a lower bound)
continued() {
    wait_console "$S" golden "$1" 'vmsnap-counter ram=.* data=[0-9]' 60 || return 1
    local got
    got=$(counter_after "$S" golden "$1")
    [ "${got% *}" -gt "$2" ] && [ "${got#* }" -gt "$3" ] ||
        fail "after the io-error: counters $got, not past $2 $3"
}
for how in resume pause; do
    read -r r d <<<"$(last_counter "$S" golden)"
    dd if=/dev/zero of="$F/filler" bs=64k 2>/dev/null || true
    wait_status io-error 60 || { fail "the guest did not stop on its full disk: $(vmc "$S" ls)"; break; }
    if [ $how = resume ]; then
        expect_fail "resume while the disk is still full" vmc "$S" resume golden
        grep -q "stopped again on a failed write to its disk" "$T/err" ||
            fail "resume of an io-error VM on a full disk: $(cat "$T/err")"
        rm -f "$F/filler"
        from=$(con_lines "$S" golden)
        vmc "$S" resume golden 2>"$T/err" || fail "resume of the io-error VM: $(cat "$T/err")"
    else
        rm -f "$F/filler"
        vmc "$S" pause golden 2>"$T/err" || fail "pause of the io-error VM: $(cat "$T/err")"
        from=$(con_lines "$S" golden)
        vmc "$S" resume golden 2>"$T/err" || fail "resume after pausing an io-error VM: $(cat "$T/err")"
    fi
    continued "$from" "$r" "$d"
    vmc "$S" ls | grep -Eq '^golden +running ' || fail "vm ls after the io-error $how: $(vmc "$S" ls)"
done

# the RAM directory too small for the guest's memory to grow
vmc "$S" pause golden || fail "pause before the small RAM directory"
read -r r d <<<"$(last_counter "$S" golden)"
# ... even for the RAM image (the copy failed half way with "No space left on device")
mount -o remount,size=$((ram_k / 2))k "$R"
expect_fail "resume into a RAM directory too small for the RAM image" vmc "$S" resume golden
grep -q "the RAM directory $R has .* MiB free, and the guest's RAM (256 MiB" "$T/err" ||
    fail "RAM directory too small for the image, resume: $(cat "$T/err")"
[ -z "$(ls -A "$R")" ] || fail "the refused resume left $(ls -A "$R")"
mount -o remount,size=$((ram_k * 3 / 2))k "$R" # the RAM image fits, 256 MiB of RAM does not
expect_fail "resume into a RAM directory too small for the guest's memory" vmc "$S" resume golden
grep -q "the RAM directory $R has .* MiB free, and the guest's RAM (256 MiB" "$T/err" ||
    fail "small RAM directory, resume: $(cat "$T/err")"
[ -z "$(ls -A "$R")" ] || fail "the refused resume left $(ls -A "$R")"
grep -q -- "--ram-overcommit" "$T/err" || fail "small RAM directory: no way out named: $(cat "$T/err")"
# --force (other checks) does not mean this one
expect_fail "resume --force into a RAM directory too small" vmc "$S" resume golden --force
grep -q "the RAM directory $R has" "$T/err" || fail "small RAM directory, --force: $(cat "$T/err")"
vmc "$S" ls | grep -Eq '^golden +paused ' || fail "vm ls after the refused resume: $(vmc "$S" ls)"
expect_fail "run with more memory than the RAM directory has room for" vmc "$S" run small \
    --kernel "$GUEST/vmlinux" --initrd "$GUEST/initrd.cpio.gz" --mem 256M
grep -q "the RAM directory $R has" "$T/err" || fail "small RAM directory, run: $(cat "$T/err")"
[ -e "$S/vms/small" ] && fail "the refused run left its VM directory"
[ -z "$(ls -A "$R")" ] || fail "the refused run left $(ls -A "$R")"
mount -o remount,size=1g "$R"
resume_check "$S" golden "$r" "$d" || done_tests
done_tests
