#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# A graceful stop (vm stop --timeout S; issue #25): a running guest gets the ACPI power button
# (QEMU's system_powerdown), powers off by itself (guest/init: "vmsnap-poweroff acpi", its disk
# synced and unmounted) and QEMU exits: --json says graceful, the disk is e2fsck-clean and holds
# the last file counter the guest printed. A guest that ignores the button (vmsnap.acpi=0) is
# stopped hard after the timeout, said, still exit 0, and so is one whose wait is interrupted
# (Ctrl-C). A paused VM (no guest to ask) stops at once.
# Without --timeout the stop is the hard one it was (no power button). Bad values: usage errors.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/integration/vm_lib.sh"
S=$T/state
from_golden "$S"
V=$S/vms/golden
# gone PID: no such process, or a zombie nobody reaped yet (QEMU's parent exited)
gone() { [ ! -e "/proc/$1" ] || [ "$(ps -o stat= -p "$1" | cut -c1)" = Z ]; }

# --- a guest that powers off: graceful, its disk clean and up to date
vmc "$S" resume golden --ready 'vmsnap-counter ram=' >/dev/null 2>"$T/err" || fail "resume: $(cat "$T/err")"
qp=$(cat "$V/pid")
from=$(con_lines "$S" golden)
rc=0 && vmc "$S" stop golden --timeout 120 --json >"$T/stop.json" 2>"$T/err" || rc=$?
[ "$rc" = 0 ] && [ "$(jget "$T/stop.json" 'j["graceful"] is True and j["removed"] is False')" = True ] ||
    fail "stop --timeout of a guest that powers off: exit $rc: $(cat "$T/stop.json" "$T/err")"
tail -n +"$((from + 1))" "$(con_log "$S" golden)" | tr -d '\r' | grep -q 'vmsnap-poweroff acpi' ||
    fail "the guest did not see its power button: $(tail -n 3 "$(con_log "$S" golden)")"
tail -n +"$((from + 1))" "$(con_log "$S" golden)" | tr -d '\r' | grep -q 'vmsnap-umounted rc=0' ||
    fail "the guest did not unmount its disk before it powered off"
gone "$qp" || fail "QEMU $qp runs after a graceful stop"
disk=$(jget "$V/vm.json" 'j["disks"][0]["path"]')
vmc "$S" ls | grep -Eq '^golden +stopped' || fail "ls after a graceful stop: $(vmc "$S" ls)"
e2fsck -fn "$disk" >"$T/fsck" 2>&1 || fail "the disk after a graceful stop: e2fsck -fn: $(tail -n 5 "$T/fsck")"
d=$(tr -d '\r' <"$(con_log "$S" golden)" | sed -n 's/.*vmsnap-counter ram=[0-9]* *data=\([0-9][0-9]*\) .*/\1/p' | tail -n1)
got=$(debugfs -R 'cat /counter' "$disk" 2>/dev/null | tr -d '\n')
[ -n "$d" ] && [ "$got" = "$d" ] || fail "file counter on the disk is '$got', the guest printed $d last"
vmc "$S" stop --rm golden || fail "stop --rm"

# --- a guest that ignores the button: stopped hard after the timeout, said, exit 0
G=$(guest_dir)
vmc "$S" run deaf --kernel "$G/vmlinux" --initrd "$G/initrd.cpio.gz" --mem "$VM_MEM" --disk-size 64M \
    --append "$(cat "$G/cmdline") vmsnap.acpi=0" --ready 'vmsnap-ready dirty=' --ready-timeout 600 >/dev/null 2>"$T/err" ||
    fail "run deaf: $(cat "$T/err")"
qp=$(cat "$S/vms/deaf/pid")
from=$(con_lines "$S" deaf)
rc=0 && vmc "$S" stop deaf --timeout 3 --json >"$T/stop.json" 2>"$T/err" || rc=$?
[ "$rc" = 0 ] && [ "$(jget "$T/stop.json" 'j["graceful"]')" = False ] &&
    grep -q "VM 'deaf': the guest did not power off within 3 s of its power button: stopped hard" "$T/err" ||
    fail "stop --timeout of a guest that ignores the button: exit $rc: $(cat "$T/stop.json" "$T/err")"
tail -n +"$((from + 1))" "$(con_log "$S" deaf)" | tr -d '\r' | grep -q 'vmsnap-poweroff' &&
    fail "the deaf guest powered off (vmsnap.acpi=0 not honoured: the case proves nothing)"
wait_for 10 gone "$qp" || fail "QEMU $qp runs after the hard stop"

# --- a graceful stop interrupted during its wait (Ctrl-C): the stop goes on, hard, exit 0 (it is
# not left half-done: a VM whose record says running with its guest told to power off)
vmc "$S" stop --rm deaf >/dev/null 2>&1
vmc "$S" run deaf --kernel "$G/vmlinux" --initrd "$G/initrd.cpio.gz" --mem "$VM_MEM" --disk-size 64M \
    --append "$(cat "$G/cmdline") vmsnap.acpi=0" --ready 'vmsnap-ready dirty=' --ready-timeout 600 >/dev/null 2>"$T/err" ||
    fail "run deaf again: $(cat "$T/err")"
qp=$(cat "$S/vms/deaf/pid")
interrupt INT 2 "$VMSNAP" vm stop deaf --timeout 600 --state-dir "$S"
[ "$irc" = 0 ] && grep -q "VM 'deaf': interrupted (SIGINT): stopped hard" "$T/err" ||
    fail "a graceful stop interrupted: exit $irc: $(cat "$T/err")"
wait_for 10 gone "$qp" || fail "QEMU $qp runs after an interrupted graceful stop"
vmc "$S" ls | grep -Eq '^deaf +stopped' || fail "ls after an interrupted graceful stop: $(vmc "$S" ls)"

# --- without --timeout: the hard stop, the guest not asked
vmc "$S" stop --rm deaf >/dev/null 2>&1
vmc "$S" run hard --kernel "$G/vmlinux" --initrd "$G/initrd.cpio.gz" --mem "$VM_MEM" --disk-size 64M \
    --append "$(cat "$G/cmdline")" --ready 'vmsnap-ready dirty=' --ready-timeout 600 >/dev/null 2>"$T/err" ||
    fail "run hard: $(cat "$T/err")"
from=$(con_lines "$S" hard)
vmc "$S" pause hard || fail "pause hard"
# a paused VM: no guest to ask, stopped at once (no 60 s wait), graceful false
rc=0 && vmc "$S" stop hard --timeout 60 --json >"$T/stop.json" 2>"$T/err" || rc=$?
[ "$rc" = 0 ] && [ "$(jget "$T/stop.json" 'j["graceful"]')" = False ] ||
    fail "stop --timeout of a paused VM: exit $rc: $(cat "$T/stop.json" "$T/err")"
vmc "$S" resume hard --ready 'vmsnap-counter ram=' >/dev/null 2>"$T/err" || fail "resume hard: $(cat "$T/err")"
from=$(con_lines "$S" hard)
vmc "$S" stop hard --json >"$T/stop.json" 2>"$T/err" || fail "stop hard: $(cat "$T/err")"
[ "$(jget "$T/stop.json" 'j["graceful"]')" = False ] || fail "a stop without --timeout: $(cat "$T/stop.json")"
tail -n +"$((from + 1))" "$(con_log "$S" hard)" | tr -d '\r' | grep -q 'vmsnap-poweroff' &&
    fail "a stop without --timeout pressed the power button"
vmc "$S" stop --rm hard >/dev/null 2>&1

# --- bad values: usage errors
for v in 0 3601 x; do
    rc=0 && vmc "$S" stop nosuch --timeout "$v" 2>"$T/err" || rc=$?
    [ "$rc" = 2 ] || fail "stop --timeout $v: exit $rc, not a usage error: $(cat "$T/err")"
done
done_tests
