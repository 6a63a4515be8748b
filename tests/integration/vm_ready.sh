#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Readiness (--ready TEXT, --ready-timeout S on vm run and vm resume; issue #25): the command
# returns once the guest printed a console line holding TEXT after it made it run, so that line
# is in the log when it returns (a wait that returned at once would not find it there), and the
# step "ready" is in its timing. A guest that prints no such line in time: exit 5, the VM left
# running (its counter goes on, a later pause works), as after a wait interrupted (exit 130). A
# QEMU that exits during the wait (killed, or terminated: its pid file gone): exit 3, said at
# once, not after the timeout. Bad values: usage errors.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/integration/vm_lib.sh"
S=$T/state
from_golden "$S"
READY='vmsnap-counter ram='

# new_lines STATE NAME FROM: the console lines after line FROM that hold $READY
new_lines() { tail -n +"$(($3 + 1))" "$(con_log "$1" "$2")" 2>/dev/null | tr -d '\r' | grep -c "$READY" || true; }

# --- resume --ready: the guest's next counter line is printed before the command returns
from=$(con_lines "$S" golden)
vmc "$S" resume golden --ready "$READY" --json >"$T/r.json" 2>"$T/err" || fail "resume --ready: $(cat "$T/err")"
[ "$(new_lines "$S" golden "$from")" -ge 1 ] ||
    fail "resume --ready returned before the guest printed '$READY': $(tail -n 2 "$(con_log "$S" golden)")"
[ "$(jget "$T/r.json" '"ready" in j["steps"] and j["steps"]["ready"] >= 0')" = True ] ||
    fail "resume --ready: no step 'ready': $(cat "$T/r.json")"
vmc "$S" pause golden || fail "pause after resume --ready"

# --- a guest that never prints the line: exit 5 after the timeout, the VM running on
from=$(con_lines "$S" golden)
rc=0 && vmc "$S" resume golden --ready 'vmsnap-never-printed' --ready-timeout 2 2>"$T/err" || rc=$?
[ "$rc" = 5 ] && grep -q "runs, but its guest printed no readiness line on its console .* within 2 s; it is left running" "$T/err" ||
    fail "resume with a readiness line never printed: exit $rc: $(cat "$T/err")"
vmc "$S" ls | grep -Eq '^golden +running' || fail "ls after the readiness timeout: $(vmc "$S" ls)"
wait_console "$S" golden "$from" "$READY" 60 || fail "the guest does not run on after the readiness timeout"
vmc "$S" pause golden || fail "pause after the readiness timeout"

# --- the wait interrupted (Ctrl-C): exit 130, the guest running on (not undone)
from=$(con_lines "$S" golden)
interrupt INT 3 "$VMSNAP" vm resume golden --ready 'vmsnap-never-printed' --ready-timeout 600 --state-dir "$S"
[ "$irc" = 130 ] || fail "resume --ready interrupted: exit $irc: $(cat "$T/err")"
vmc "$S" ls | grep -Eq '^golden +running' || fail "ls after an interrupted readiness wait: $(vmc "$S" ls)"
wait_console "$S" golden "$from" "$READY" 60 || fail "the guest does not run on after an interrupted readiness wait"
vmc "$S" pause golden || fail "pause after an interrupted readiness wait"

# --- QEMU gone during the wait: exit 3 (ESRCH), said before the 600 s timeout; killed (its pid
# file left behind) or terminated (QEMU removes its pid file as it exits)
for sig in KILL TERM; do
    vmc "$S" resume golden --ready 'vmsnap-never-printed' --ready-timeout 600 2>"$T/err" &
    job=$!
    wait_for 60 test -s "$S/vms/golden/pid" && wait_console "$S" golden "$(con_lines "$S" golden)" "$READY" 60 quiet ||
        fail "the resume did not start its guest"
    kill -"$sig" "$(cat "$S/vms/golden/pid")" 2>/dev/null
    rc=0 && wait "$job" || rc=$?
    [ "$rc" = 3 ] && grep -q "its QEMU exited before the guest printed its readiness line" "$T/err" ||
        fail "resume whose QEMU died (SIG$sig) during the readiness wait: exit $rc: $(cat "$T/err")"
done
vmc "$S" stop --rm golden >/dev/null 2>&1 || true

# --- run --ready: returns once the booted guest said it is ready (guest/init's "vmsnap-ready",
# printed once its disk is mounted and its blob made)
G=$(guest_dir)
rc=0 && vmc "$S" run fresh --kernel "$G/vmlinux" --initrd "$G/initrd.cpio.gz" --mem "$VM_MEM" \
    --disk-size 64M --append "$(cat "$G/cmdline")" --ready 'vmsnap-ready dirty=' --ready-timeout 600 --json >"$T/run.json" 2>"$T/err" || rc=$?
[ "$rc" = 0 ] || fail "run --ready: exit $rc: $(cat "$T/err")"
tr -d '\r' <"$(con_log "$S" fresh)" | grep -q 'vmsnap-ready dirty=' || fail "run --ready returned before the guest printed 'vmsnap-ready'"
[ "$(jget "$T/run.json" '"ready" in j["steps"] and "boot" in j["steps"]')" = True ] ||
    fail "run --ready: steps: $(cat "$T/run.json")"
vmc "$S" stop --rm fresh || fail "stop --rm fresh"

# --- bad values: usage errors (nothing started)
for args in "--ready-timeout 5" "--ready '' " "--ready x --ready-timeout 0" "--ready x --ready-timeout 3601" \
    "--ready $(printf 'x%.0s' {1..257})"; do
    rc=0 && eval vmc "\$S" resume golden "$args" 2>"$T/err" || rc=$?
    [ "$rc" = 2 ] || fail "resume $args: exit $rc, not a usage error: $(cat "$T/err")"
done
done_tests
