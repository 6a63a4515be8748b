#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Faults: QEMU killed mid-run (vm ls shows it dead, resume from the last checkpoint works); a
# suspend whose upload fails keeps the local checkpoint and says so (a later suspend succeeds);
# a corrupted object in the store makes resume refuse, naming the object, with the snapshot
# untouched and nothing left on the resuming node; hostile sets (a node file as initrd, QEMU
# options as accelerator, a memory image of the wrong size) refused; a failed resume keeps a
# stopped VM's disk; a snapshot stored nowhere stays in the stage until a suspend stores it; a
# VM whose QEMU does not answer is not resumed (its RAM file stays).
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/integration/vm_lib.sh"
# the reference layout's contract (objects at <set>/<name>.zstd, --base copies); the layered
# layout's suspends and resumes are tests/integration/vm_layers.sh
export VMSNAP_LAYOUT=reference
S=$T/state
from_golden "$S"
resume_check "$S" golden "$golden_ram" "$golden_data" || done_tests
sleep 4 # run past the window resume_check accepts, so going back to the golden is visible
read -r r _ <<<"$(last_counter "$S" golden)"
[ "$r" -gt "$((golden_ram + 2))" ] || fail "the guest did not run on before the kill (ram $r)"
pid=$(cat "$S/vms/golden/pid")
kill -9 "$pid"
wait_for 5 not kill -0 "$pid" 2>/dev/null || true
sleep 0.5
vmc "$S" ls | grep -Eq '^golden +dead' || fail "vm ls after kill -9: $(vmc "$S" ls)"
expect_fail "pause of a dead VM" vmc "$S" pause golden
grep -q 'exited while the guest ran.*goes back to its last checkpoint' "$T/err" || fail "pause of a dead VM: $(cat "$T/err")"
# a suspend of the dead VM pushes its last checkpoint, saying what is lost (it said nothing),
# and removes the dead QEMU's RAM file (tmpfs: it stayed)
ram=$(ls "$VMSNAP_RAM_DIR"/vmsnap-*-golden.ram)
vmc "$S" suspend golden "$T/deadstore/set" 2>"$T/err" || fail "suspend of a dead VM: $(cat "$T/err")"
grep -q "VM 'golden' is dead (its QEMU exited while the guest ran): suspending its last checkpoint" "$T/err" ||
    fail "suspend of a dead VM said: $(cat "$T/err")"
[ -e "$ram" ] && fail "the suspend of a dead VM left its RAM file $ram"
# resume goes back to the golden checkpoint: the counters continue from there, not from later
resume_check "$S" golden "$golden_ram" "$golden_data" "$T/deadstore/set" || done_tests
[ "$(blob_md5 "$S" golden)" = "$boot_md5" ] || fail "RAM blob md5 after resume of a killed VM"
expect_fail "resume of a running VM" vmc "$S" resume golden
grep -q 'running' "$T/err" || fail "resume of a running VM: $(cat "$T/err")"

# a mistyped URL is refused before the VM stops (the guest kept running)
expect_fail "suspend to a mistyped URL" vmc "$S" suspend golden s3:/bucket/key
grep -q "a mistyped URL" "$T/err" || fail "suspend to a mistyped URL: $(cat "$T/err")"
vmc "$S" ls | grep -Eq '^golden +running' || fail "a suspend to a mistyped URL stopped the VM: $(vmc "$S" ls)"

# a VM whose QEMU runs but does not answer (stopped) is not resumed: resume took it for dead
# and removed the RAM file that QEMU still ran on (the next pause lost the guest)
pid=$(cat "$S/vms/golden/pid")
ram=$(ls "$VMSNAP_RAM_DIR"/vmsnap-*-golden.ram)
kill -STOP "$pid"
# (vm ls says so after a short wait of its own: it waited the whole QMP timeout, 60 s, per VM,
# and said "other")
vmc "$S" ls >"$T/ls.out" 2>&1 || true
grep -Eq '^golden +unresponsive +[0-9]+ ' "$T/ls.out" || fail "vm ls of a VM whose QEMU does not answer: $(cat "$T/ls.out")"
export VMSNAP_QMP_TIMEOUT=2
rc=0 && vmc "$S" resume golden >/dev/null 2>"$T/err" || rc=$?
unset VMSNAP_QMP_TIMEOUT
kill -CONT "$pid"
[ "$rc" = 5 ] || fail "resume of a VM whose QEMU does not answer: exit $rc ($(cat "$T/err"))"
grep -q "cannot tell whether its QEMU still runs the guest" "$T/err" ||
    fail "resume of a VM whose QEMU does not answer: $(cat "$T/err")"
[ -e "$ram" ] || fail "resume of a VM whose QEMU does not answer removed its RAM file"
vmc "$S" ls | grep -Eq '^golden +running' || fail "after the refused resume: $(vmc "$S" ls)"

# vm stop --rm with another --ram-dir than the VM's is refused before it does anything (it
# removed the record and left the RAM file, tmpfs memory, for good)
mkdir -p "$VMSNAP_RAM_DIR/other"
expect_fail "vm stop --rm with another --ram-dir" vmc "$S" stop --rm golden --ram-dir "$VMSNAP_RAM_DIR/other"
grep -q "keeps its RAM in .*give the --ram-dir" "$T/err" || fail "stop --rm, wrong RAM dir: $(cat "$T/err")"
vmc "$S" ls | grep -Eq '^golden +running' || fail "a refused stop --rm changed the VM: $(vmc "$S" ls)"
rmdir "$VMSNAP_RAM_DIR/other"

# ... and so is a local store path under a regular file (it failed the push after the VM was
# stopped)
touch "$T/notadir"
expect_fail "suspend to a store path under a file" vmc "$S" suspend golden "$T/notadir/set"
grep -q "$T/notadir is not a directory" "$T/err" || fail "suspend under a file: $(cat "$T/err")"
vmc "$S" ls | grep -Eq '^golden +running' || fail "a suspend under a file stopped the VM: $(vmc "$S" ls)"

# ... and so is a local store inside the VMs' own directories: the suspend stored the set,
# then its teardown removed it with the VM's local files (exit 0, the VM lost)
for u in "$S/vms/golden/ondemand" "file://$S/vms/other/x" "$S/vms/nothere/../golden/ondemand" \
    "$VMSNAP_RAM_DIR/vmsnap-0000abcd-golden.stage/set"; do
    expect_fail "suspend into a directory vmsnap manages ($u)" vmc "$S" suspend golden "$u"
    grep -q "is inside .*, which vmsnap manages" "$T/err" || fail "suspend into $u: $(cat "$T/err")"
done
# a relative URL climbing with '..' is resolved from the working directory, as the store does
rc=0 && (cd "$T" && "$VMSNAP" vm suspend golden "../$(basename "$T")/state/vms/golden/ondemand" \
    --state-dir "$S") >/dev/null 2>"$T/err" || rc=$?
[ "$rc" = 1 ] && grep -q "which vmsnap manages" "$T/err" ||
    fail "suspend to a relative '..' URL into the VM's directory: exit $rc: $(cat "$T/err")"
vmc "$S" ls | grep -Eq '^golden +running' || fail "a refused suspend stopped the VM: $(vmc "$S" ls)"

# upload fails (the store is a 1 MiB tmpfs: full): the checkpoint is kept locally
sleep 1
[ "$(id -u)" = 0 ] || skip "the full-store cases mount a tmpfs: needs root"
mkdir "$T/full" && mount -t tmpfs -o size=1m vmsnap-test-store "$T/full" || skip "cannot mount a tmpfs"
at_exit 'umount "$T/full" 2>/dev/null || true'
FULL=$T/full/set
expect_fail "suspend to a full store" vmc "$S" suspend golden "$FULL"
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
read -r gr gd <<<"$(last_counter "$S" golden)"
cp -a "$STORE/set" "$STORE/good"
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
# a URL naming one object, not a set: said so (it failed renaming the object over the stage)
expect_fail "resume from a single object" vmc "$B" resume golden "$STORE/good/memory-ranges.zstd"
grep -q "no snapshot set there (no manifest.json): it is a single object" "$T/err" ||
    fail "resume from a single object: $(cat "$T/err")"
[ -z "$(vmc "$B" ls | tail -n +2)" ] || fail "a resume from a single object left a VM record: $(vmc "$B" ls)"
# a VM whose record is unreadable is not resumed (it could not tell whether its QEMU still runs)
cp "$S/vms/golden/vm.json" "$T/vm.json.bak"
echo '{ broken' >"$S/vms/golden/vm.json"
expect_fail "resume with an unreadable vm.json" vmc "$S" resume golden
grep -q "unreadable record" "$T/err" || fail "unreadable vm.json: $(cat "$T/err")"
cp "$T/vm.json.bak" "$S/vms/golden/vm.json"
ls "$VMSNAP_RAM_DIR" | grep -q 'golden\.\(stage\|ram\)' && fail "failed resume left files on tmpfs"

# A set is not trusted to name node files: QEMU would hand an initrd such as /etc/hostname to the
# guest (fw_cfg). Its kernel and initrd must lie under the node's asset directories; its
# accelerator must be kvm or tcg; its memory image must be the VM's memory size.
G=$VMSNAP_ASSET_DIRS
C=$T/node-c
VM_DIRS+=("$C")
"$VMSNAP" -q pull "$STORE/good" "$T/h" || fail "pull of the good set"
hostile() { # NAME PYTHON: push the good set with config.json edited by PYTHON (on dict c)
    rm -rf "$T/h2" && cp -a "$T/h" "$T/h2"
    python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); exec(sys.argv[2]); json.dump(c, open(sys.argv[1], "w"))' \
        "$T/h2/config.json" "$2"
    "$VMSNAP" -q push "$T/h2" "$STORE/$1" || fail "push of the edited set $1"
}
hostile h-initrd 'c["initrd"] = "/etc/hostname"'
expect_fail "resume of a set naming a node file as its initrd" vmc "$C" resume golden "$STORE/h-initrd"
grep -q "initrd /etc/hostname, which is not a file under the asset directories" "$T/err" ||
    fail "node file as initrd: $(cat "$T/err")"
mkdir -p "$T/assets" && ln -sf /etc/hostname "$T/assets/initrd"
hostile h-link "c[\"initrd\"] = \"$T/assets/initrd\""
VMSNAP_ASSET_DIRS="$G:$T/assets" expect_fail "resume of a set whose initrd is a symlink out of the asset directories" \
    vmc "$C" resume golden "$STORE/h-link"
grep -q "not a file under the asset directories" "$T/err" || fail "symlinked initrd: $(cat "$T/err")"
hostile h-rel 'c["initrd"] = "initrd.cpio.gz"'
(cd "$G" && expect_fail "resume of a set naming a relative initrd" vmc "$C" resume golden "$STORE/h-rel")
grep -q "not a file under the asset directories" "$T/err" || fail "relative initrd: $(cat "$T/err")"
refused() { # NAME PYTHON DESCRIPTION EXPECTED: a set edited so is refused with that message
    hostile "$1" "$2"
    expect_fail "resume of a set with $3" vmc "$C" resume golden "$STORE/$1"
    grep -q "$4" "$T/err" || fail "$3: $(cat "$T/err")"
}
refused h-accel 'c["accel"] = "tcg,thread=single"' "QEMU options as its accelerator" \
    "accelerator 'tcg,thread=single' is neither kvm nor tcg"
refused h-mem 'c["memory"] = c["memory"] // 2' "a memory image that is not the VM's memory" \
    "the memory image holds .* the VM's memory is"
# fields out of what a VM's config holds, each refused naming the field before anything is
# staged: a generation at 2^63-1 wrapped to -2^63 at the next pause and then an older snapshot
# replaced the newer checkpoint; a 400 KB config made a record no command could read again
# (the VM unlisted and unstoppable); "cpus": "1" was reported as "vCPUs 0"
refused h-gen 'c["generation"] = 9223372036854775807' "a generation at the top" \
    '"generation" is 9223372036854775807, not a whole number in \[0, '
refused h-cpus 'c["cpus"] = "1"' "vCPUs as a string" '"cpus" is "1", not a whole number in \[1, 64\]'
refused h-disks 'del c["disks"]' "no disks" '"disks" is missing or not a list of disk objects'
# vm run takes no command line that a resume would refuse (its only snapshot could be one)
expect_fail "vm run with a 5000-byte --append" vmc "$C" run tbig --kernel "$G/vmlinux" \
    --append "$(head -c 5000 /dev/zero | tr '\0' a)"
grep -q "append is 5000 bytes, more than a kernel command line takes (4096)" "$T/err" ||
    fail "vm run --append 5000: $(cat "$T/err")"
refused h-big 'c["x"] = [0] * 200000' "a 400 KB config" \
    "config.json: [0-9]* bytes, more than a VM's config takes"
rm -rf "$T/h2" && cp -a "$T/h" "$T/h2" && printf ' garbage {{{' >>"$T/h2/config.json"
"$VMSNAP" -q push "$T/h2" "$STORE/h-trail" || fail "push of the set with bytes after its config"
expect_fail "resume of a set with bytes after its config" vmc "$C" resume golden "$STORE/h-trail"
grep -q "config.json: not a JSON object" "$T/err" || fail "trailing bytes: $(cat "$T/err")"
VMSNAP_ASSET_DIRS= expect_fail "resume from a store with no asset directory" vmc "$C" resume golden "$STORE/good"
grep -q "no asset directory" "$T/err" || fail "no asset directory: $(cat "$T/err")"
[ -z "$(vmc "$C" ls | tail -n +2)" ] || fail "refused resumes left a VM record: $(vmc "$C" ls)"
ls "$VMSNAP_RAM_DIR" | grep -q 'golden\.\(stage\|ram\)' && fail "refused resumes left files on tmpfs"
# --kernel/--initrd: the caller vouches for them
VMSNAP_ASSET_DIRS= resume_check "$C" golden "$gr" "$gd" "$STORE/good" --kernel "$G/vmlinux" \
    --initrd "$G/initrd.cpio.gz" || done_tests

# A resume that fails after staging leaves a stopped VM's own disk as it was
vmc "$C" stop golden || fail "stop on node C"
disk_md5=$(md5sum <"$C/vms/golden/disk-vda.ext4")
rm -rf "$T/h2" && cp -a "$T/h" "$T/h2" && head -c 8192 /dev/urandom >"$T/h2/state"
"$VMSNAP" -q push "$T/h2" "$STORE/h-state" || fail "push of the set with a bad device state"
expect_fail "resume from a set with a corrupt device state" vmc "$C" resume golden "$STORE/h-state"
[ "$(md5sum <"$C/vms/golden/disk-vda.ext4")" = "$disk_md5" ] ||
    fail "a failed resume replaced the stopped VM's disk"
[ -e "$C/vms/golden/disk-vda.ext4.prev" ] && fail "a failed resume left the disk's .prev"

# A suspend that can store its snapshot neither in the store nor locally (the VM directory is
# immutable) keeps it in the stage, marked: resume from a URL refuses while it is there, stop keeps
# it, a resume without a URL restores it, and the next suspend stores it
resume_check "$C" golden "$gr" "$gd" "$STORE/good" || done_tests
sleep 1
if chattr +i "$C/vms/golden" 2>/dev/null; then
    expect_fail "suspend that can store nothing" vmc "$C" suspend golden "$FULL"
    chattr -i "$C/vms/golden"
    grep -q "snapshot is left in" "$T/err" || fail "unsaved suspend: $(cat "$T/err")"
    stage=$(ls -d "$VMSNAP_RAM_DIR"/vmsnap-*-golden.stage 2>/dev/null | while read -r d; do
        [ -e "$d/.vmsnap-unsaved" ] && echo "$d"; done | head -n1)
    [ -n "$stage" ] || fail "no marked stage after a suspend that stored nothing"
    vmc "$C" ls | grep -Eq '^golden +unsaved' || fail "vm ls of an unsaved VM: $(vmc "$C" ls)"
    read -r ur ud <<<"$(last_counter "$C" golden)"
    expect_fail "resume from a URL while the only copy is in the stage" vmc "$C" resume golden "$STORE/good"
    grep -q "could not store" "$T/err" || fail "resume with an unsaved stage: $(cat "$T/err")"
    vmc "$C" stop golden 2>/dev/null || true
    [ -f "$stage/memory-ranges" ] || fail "vm stop removed the only copy of the snapshot"
    # a resume without a URL restores it from the stage (the store may be down for long)
    resume_check "$C" golden "$ur" "$ud" || done_tests
    [ -e "$stage" ] && fail "the stage is still there after the VM resumed from it"
    # again, and this time the next suspend stores it
    sleep 1
    chattr +i "$C/vms/golden"
    expect_fail "second suspend that can store nothing" vmc "$C" suspend golden "$FULL"
    chattr -i "$C/vms/golden"
    [ -e "$stage/.vmsnap-unsaved" ] || fail "no marked stage after the second suspend that stored nothing"
    read -r ur ud <<<"$(last_counter "$C" golden)"
    vmc "$C" suspend golden "$STORE/saved" || fail "suspend of the unsaved snapshot"
    [ -e "$stage" ] && fail "the stage is still there after it was stored"
    D=$T/node-d
    VM_DIRS+=("$D")
    resume_check "$D" golden "$ur" "$ud" "$STORE/saved" || done_tests
    # a local checkpoint newer than the snapshot a resume names is not replaced without --force
    sleep 1
    vmc "$D" pause golden || fail "pause on node D"
    read -r pr pd <<<"$(last_counter "$D" golden)"
    expect_fail "resume from an older snapshot over a newer local checkpoint" vmc "$D" resume golden "$STORE/saved"
    grep -q "is newer than the snapshot at" "$T/err" || fail "newer local checkpoint: $(cat "$T/err")"
    [ -f "$D/vms/golden/checkpoint/memory-ranges" ] || fail "the refused resume removed the newer checkpoint"
    resume_check "$D" golden "$pr" "$pd" || done_tests
    sleep 1
    vmc "$D" pause golden || fail "second pause on node D"
    # a snapshot of another VM (another base id) does not replace the local checkpoint either
    # (it was removed without a word, and the name went on as the other VM)
    "$VMSNAP" -q pull "$STORE/saved" "$T/other" || fail "pull of the set to copy"
    ob=$(cat "$T/other/base-id")
    nb=$(printf '%s' "$ob" | tr '0-9a-f' 'fedcba9876543210')
    sed -i "s/$ob/$nb/g" "$T/other/config.json" "$T/other/base-id"
    "$VMSNAP" -q push "$T/other" "$STORE/other" || fail "push of the other VM's set"
    expect_fail "resume of another VM's snapshot over a local checkpoint" vmc "$D" resume golden "$STORE/other"
    grep -q "is of another VM (base id $ob) than the snapshot at $STORE/other (base id $nb)" "$T/err" ||
        fail "another VM's snapshot over a local checkpoint: $(cat "$T/err")"
    [ -f "$D/vms/golden/checkpoint/memory-ranges" ] || fail "the refused resume removed the checkpoint"
    resume_check "$D" golden "$ur" "$ud" "$STORE/saved" --force || done_tests
else
    fail "chattr +i is not available on $T: the unsaved-stage case could not run"
fi
done_tests
