#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Fixture for the VM tests: boot the counter guest once (real QEMU, TCG here), check it runs and
# writes its upper disk, pause it to a local checkpoint and keep that state directory as the
# golden the other VM tests resume from. Asserts the checkpoint layout along the way.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/integration/vm_lib.sh"
G=$(guest_dir)
rm -rf "$GOLDEN"
S=$T/state
VM_DIRS+=("$S")
append="$(cat "$G/cmdline") vmsnap.dirty=16"
vmc "$S" run golden --kernel "$G/vmlinux" --initrd "$G/initrd.cpio.gz" --mem "$VM_MEM" \
    --disk-size 256M --append "$append" || { fail "vm run"; done_tests; }
ram=$(jget "$S/vms/golden/vm.json" 'j["ram_path"]')
[ -f "$ram" ] || fail "guest RAM file $ram missing"
[ "$(stat -f -c %T "$(dirname "$ram")")" = tmpfs ] || fail "guest RAM $ram is not on tmpfs"
vmc "$S" ls | grep -Eq '^golden +running' || fail "vm ls does not show golden running: $(vmc "$S" ls)"
expect_fail "second run with the same name" vmc "$S" run golden --kernel "$G/vmlinux"
grep -q "already exists" "$T/err" || fail "duplicate name error: $(cat "$T/err")"

# a bad asset: QEMU exits at once; the error carries its message and nothing is left behind
expect_fail "run with a missing kernel" vmc "$S" run bad --kernel "$T/no-such-vmlinux" --mem 64M \
    --disk-size 16M
grep -q "could not open kernel" "$T/err" || fail "missing kernel error: $(cat "$T/err")"
[ ! -e "$S/vms/bad" ] || fail "failed run left $S/vms/bad"
ls "$VMSNAP_RAM_DIR" | grep -q -- '-bad\.ram$' && fail "failed run left its RAM file"
expect_fail "RAM dir on a disk filesystem" vmc "$S" run bad2 --kernel "$G/vmlinux" --ram-dir "$T"
grep -q "not tmpfs" "$T/err" || fail "disk RAM dir error: $(cat "$T/err")"
# a run killed while its QEMU starts (a wrapper that waits first) leaves a VM that ls shows and
# stop --rm removes with its QEMU and RAM file: it left an orphan QEMU no command could remove
printf '#!/bin/sh\nsleep 2\nexec %s "$@"\n' "$(command -v qemu-system-x86_64)" >"$T/slowqemu"
chmod +x "$T/slowqemu"
"$VMSNAP" vm run killed --state-dir "$S" --kernel "$G/vmlinux" --initrd "$G/initrd.cpio.gz" --mem "$VM_MEM" \
    --disk-size 16M --append "$append" --qemu "$T/slowqemu" >/dev/null 2>&1 &
rpid=$!
sleep 1
kill -TERM "$rpid"
wait "$rpid" 2>/dev/null || true
wait_for 10 pgrep -f "$S/vms/killed/" >/dev/null || true
sleep 0.5
vmc "$S" ls | grep -q '^killed ' || fail "vm ls does not show a killed run: $(vmc "$S" ls)"
vmc "$S" stop --rm killed 2>"$T/err" || fail "stop --rm of a killed run: $(cat "$T/err")"
wait_for 5 not pgrep -f "$S/vms/killed/" >/dev/null || fail "QEMU of a killed run still runs after stop --rm"
[ ! -e "$S/vms/killed" ] || fail "stop --rm left $S/vms/killed"
ls "$VMSNAP_RAM_DIR" | grep -q -- '-killed\.ram$' && fail "stop --rm left the killed run's RAM file"

wait_console "$S" golden 0 'vmsnap-counter ram=3 ' 120 || done_tests
boot_md5=$(tr -d '\r' <"$(con_log "$S" golden)" | sed -n 's/.*vmsnap-ready .*blob=\([0-9a-f]*\).*/\1/p')
[ ${#boot_md5} = 32 ] || fail "no blob md5 in the ready line"
[ "$boot_md5" != d41d8cd98f00b204e9800998ecf8427e ] || fail "the guest's blob is empty"
live_ino=$(stat -c %i "$S/vms/golden/disk-vda.ext4")

vmc "$S" pause golden -v 2>"$T/pause.err" || fail "pause: $(cat "$T/pause.err")"
grep -Eq '^  snapshot +[0-9]+\.[0-9]{3} s$' "$T/pause.err" ||
    fail "pause -v shows no step timings: $(cat "$T/pause.err")"
read -r last_ram last_data <<<"$(last_counter "$S" golden)"
C=$S/vms/golden/checkpoint
for f in memory-ranges state config.json base-id rootfs-disk-vda.ext4; do
    [ -f "$C/$f" ] || fail "checkpoint lacks $f"
done
[ "$(stat -c %s "$C/memory-ranges")" = $((256 << 20)) ] || fail "memory-ranges is not the RAM size"
alloc=$(allocated "$C/memory-ranges")
[ "$alloc" -lt $((256 << 20)) ] || fail "memory-ranges is not sparse ($alloc bytes allocated)"
[ "$alloc" -gt $((16 << 20)) ] || fail "memory-ranges holds less than the 16 MiB blob ($alloc)"
[ "$(stat -c %i "$C/rootfs-disk-vda.ext4")" = "$live_ino" ] ||
    fail "the checkpoint's disk is not the VM's disk hard-linked"
[ ! -e "$ram" ] || fail "RAM file $ram not freed after pause"
grep -q '"ram_in_state": false' "$C/config.json" || fail "config.json: ram_in_state"
vmc "$S" ls | grep -Eq '^golden +paused .*checkpoint' || fail "vm ls after pause: $(vmc "$S" ls)"
pgrep -f "$S/vms/golden/qmp.sock" >/dev/null && fail "QEMU still running after pause"
expect_fail "pause of a paused VM" vmc "$S" pause golden

if [ "$fails" = 0 ]; then
    mkdir -p "$GOLDEN.tmp"
    cp -a --sparse=always "$S" "$GOLDEN.tmp/state"
    printf 'boot_md5=%s\ngolden_ram=%s\ngolden_data=%s\nGUEST=%s\n' "$boot_md5" "$last_ram" \
        "$last_data" "$G" >"$GOLDEN.tmp/golden.env"
    mv "$GOLDEN.tmp" "$GOLDEN"
fi
done_tests
