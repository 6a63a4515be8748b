#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# pause -> resume on the same node: both counters continue and the RAM blob's md5 is intact
# (eager and on-demand), twice in a row; the upper disk is e2fsck-clean once the guest
# unmounted it, and holds the guest's last file counter. QEMU runs under -sandbox. Other
# spellings of the state directory (a trailing slash, a relative path) name the same VM.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/integration/vm_lib.sh"
S=$T/state
from_golden "$S"
resume_check "$S" golden "$golden_ram" "$golden_data" || done_tests
[ "$(blob_md5 "$S" golden)" = "$boot_md5" ] || fail "RAM blob md5 changed across pause/resume"
# QEMU runs under its seccomp sandbox (-sandbox: no spawning; state moves through a passed fd)
grep -q '^Seccomp:[[:space:]]*2' "/proc/$(cat "$S/vms/golden/pid")/status" ||
    fail "QEMU is not running under seccomp: $(grep Seccomp "/proc/$(cat "$S/vms/golden/pid")/status")"
C=$S/vms/golden/checkpoint
[ -d "$C" ] || fail "the local checkpoint is gone after resume (it must be preserved)"
# page-cache hygiene: the checkpoint's memory image is not left cached next to the guest
n=$(cached_pages "$C/memory-ranges")
[ "$n" -le 16 ] || fail "after resume $n pages of the checkpoint's memory image are cached"
[ -e "$VMSNAP_RAM_DIR/$(basename "$(jget "$S/vms/golden/vm.json" 'j["ram_path"]')")" ] ||
    fail "eager resume: no RAM file on the RAM directory"

# second cycle, on demand: the image is mapped privately from the checkpoint
sleep 2
vmc "$S" pause golden || fail "second pause"
n=$(cached_pages "$C/memory-ranges")
[ "$n" -le 16 ] || fail "after pause $n pages of the checkpoint's memory image are cached"
read -r r d <<<"$(last_counter "$S" golden)"
cp "$C/memory-ranges" "$T/img.before" --sparse=always
resume_check "$S" golden "$r" "$d" --on-demand || done_tests
[ "$(jget "$S/vms/golden/vm.json" 'j["ram_path"]')" = "$C/memory-ranges" ] ||
    fail "on-demand resume does not map the checkpoint image"
sleep 2
cmp -s "$C/memory-ranges" "$T/img.before" || fail "on-demand resume modified the checkpoint image"
[ "$(blob_md5 "$S" golden)" = "$boot_md5" ] || fail "RAM blob md5 changed across on-demand resume"
# an on-demand VM's next checkpoint carries its RAM in the state; resume it eagerly
vmc "$S" pause golden || fail "pause of an on-demand VM"
grep -q '"ram_in_state": true' "$C/config.json" || fail "on-demand checkpoint: ram_in_state"
read -r r d <<<"$(last_counter "$S" golden)"
resume_check "$S" golden "$r" "$d" || done_tests
[ "$(blob_md5 "$S" golden)" = "$boot_md5" ] || fail "RAM blob md5 changed after RAM-in-state restore"

# the guest unmounts /data; the checkpointed disk is then clean and holds the last counter
from=$(con_lines "$S" golden)
vmc "$S" console golden --send umount || fail "console --send"
wait_console "$S" golden "$from" 'vmsnap-umounted rc=0' 60 || done_tests
vmc "$S" pause golden || fail "pause after umount"
d=$(tr -d '\r' <"$(con_log "$S" golden)" |
    sed -n 's/.*vmsnap-counter ram=[0-9]* *data=\([0-9][0-9]*\) .*/\1/p' | tail -n1)
e2fsck -fn "$C/rootfs-disk-vda.ext4" >"$T/fsck" 2>&1 || fail "e2fsck -fn: $(tail -n 5 "$T/fsck")"
got=$(debugfs -R 'cat /counter' "$C/rootfs-disk-vda.ext4" 2>/dev/null | tr -d '\n')
[ "$got" = "$d" ] || fail "file counter on the disk is '$got', the guest printed $d last"
vmc "$S" stop golden || fail "stop"
vmc "$S" ls | grep -Eq '^golden +paused' || fail "vm ls after stop of a paused VM: $(vmc "$S" ls)"

# another spelling of the state directory (trailing slash, relative) is the same VM: it started
# a second QEMU of one VM, and 'vm stop' under the first spelling left the other running
from=$(con_lines "$S" golden)
vmc "$S/" resume golden >/dev/null 2>"$T/err" || fail "resume under 'STATE/': $(cat "$T/err")"
wait_console "$S" golden "$from" 'vmsnap-counter ram=' 60 || done_tests
pid=$(cat "$S/vms/golden/pid")
vmc "$S" ls | grep -Eq '^golden +running' || fail "vm ls under the other spelling: $(vmc "$S" ls)"
(cd "$T" && "$VMSNAP" vm resume golden --state-dir state) >/dev/null 2>"$T/err" && fail "a second resume under a relative spelling succeeded"
grep -q "is running" "$T/err" || fail "second resume, relative spelling: $(cat "$T/err")"
[ "$(pgrep -f "$S/vms/golden/" | wc -l)" = 1 ] || fail "QEMU processes of the VM: $(pgrep -af "$S/vms/golden/")"
vmc "$S" stop golden || fail "stop under the first spelling"
wait_for 5 not kill -0 "$pid" 2>/dev/null ||
    fail "vm stop left the QEMU started under another spelling (pid $pid)"
done_tests
