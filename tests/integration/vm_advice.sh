#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Every VM message that advises a command (lib/vm/, issue #22): each state is provoked for real
# (QEMU killed, a resume or suspend killed or stopped at a failpoint, a directory the VM's
# state goes to made immutable, chattr +i, which even root cannot write past, and lifted once
# the message is printed: a filesystem that comes back; a store down: a port nobody listens on),
# the message is checked, and the command it advises, as it spells it (a placeholder such as URL
# or DIR put as the test's value), is run: it must exit 0 and leave what it promises. A resume
# must leave the guest running (its counter goes on) with the RAM blob it booted with. The table
# lists every advising message under lib/vm/ with its case; a message it does not know fails.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/integration/vm_lib.sh"
. "$SRC/tests/integration/advice_lib.sh"

# FILE^COMMAND (as the source spells it)^FRAGMENT of the message^CASE
ADVICE_TABLE="
lib/vm/vm_suspend.c^'vmsnap vm resume %s'^incoming, not running^incoming
lib/vm/vm_suspend.c^'vmsnap vm resume %s'^goes back to its last checkpoint^dead_ckpt
lib/vm/vm_resume.c^'vmsnap vm resume %s'^is frozen^frozen
lib/vm/vm_resume.c^'vmsnap vm stop %s'^is frozen^frozen
lib/vm/vm_recover.c^'vmsnap vm stop %s'^does not let the guest run^none: a QEMU that holds a stopped guest and refuses 'cont' for 30 s (or stops it again each time) cannot be made from the outside here: a SIGSTOPped one does not answer, which is the unresponsive case
lib/vm/vm_suspend.c^'vmsnap vm resume %s'^VM stopped; the state it took is kept in^pause_unfinished
lib/vm/vm_stop.c^'vmsnap vm resume %s'^completes it once that is fixed^pause_unfinished
lib/vm/vm_recover.c^'vmsnap vm resume %s'^which completes it first^pause_unfinished
lib/vm/vm_suspend.c^'vmsnap vm resume %s'^the VM is stopped; the state it took is kept in^suspend_taken
lib/vm/vm_suspend.c^'vmsnap vm resume %s'^incomplete (no %s), for the next^stage_incomplete
lib/vm/vm_suspend.c^'vmsnap vm resume %s'^the VM's record could not be updated^record_failed
lib/vm/vm_suspend.c^'vmsnap vm resume %s %s'^the VM's record could not be updated^record_failed
lib/vm/vm_suspend.c^'vmsnap vm suspend %s URL'^upload failed; the VM is stopped^upload_failed
lib/vm/vm_suspend.c^'vmsnap vm resume %s'^upload failed; the VM is stopped^upload_failed
lib/vm/vm_suspend.c^'vmsnap vm resume %s URL'^and no checkpoint here^dead_no_ckpt
lib/vm/vm_suspend.c^'vmsnap vm stop --rm %s'^and no checkpoint here^dead_no_ckpt
lib/vm/vm_resume.c^'vmsnap vm resume %s'^its last suspend could not store^unsaved_stage
lib/vm/vm_resume.c^'vmsnap vm suspend %s URL'^its last suspend could not store^unsaved_stage
lib/vm/vm_suspend.c^'vmsnap vm suspend %s URL'^again to store it^stage_kept
lib/vm/vm_suspend.c^'vmsnap vm stop'^could not be marked as unsaved^none: warns against a stop or resume (advises none to run); its state, a stage its unsaved mark cannot be written in while the stage itself was just written, needs the stage's directory to refuse one file and not the others
lib/vm/vm_suspend.c^'vmsnap vm stop %s --ram-dir DIR'^with that directory removes it^other_ram_dir
lib/vm/vm_resume.c^'vmsnap vm resume %s URL'^has no local checkpoint in^no_ckpt
lib/vm/vm_resume.c^'vmsnap vm stop --rm %s'^has no local checkpoint in^no_ckpt
lib/vm/vm_resume.c^'vmsnap vm stop %s'^cannot tell whether its QEMU still runs^qemu_mute
"
advice_check_table lib/vm
[ "$fails" = 0 ] || done_tests
. "$SRC/tests/integration/xfer_s3_lib.sh"
B=s3://$BUCKET

A=$T/a
from_golden "$A"
V=$A/vms/golden
ST=$T/store
IMMUTABLE=()
immutable() { chattr +i "$@" && IMMUTABLE+=("$@"); }
mutable() { chattr -i "$@"; }
at_exit 'for p in ${IMMUTABLE[@]+"${IMMUTABLE[@]}"}; do chattr -i "$p" 2>/dev/null; done'
mkdir -p "$T/ct" && chattr +i "$T/ct" 2>/dev/null && ! touch "$T/ct/x" 2>/dev/null && chattr -i "$T/ct" ||
    skip "chattr +i does not stop writes under $T (the refusing filesystem cannot be made here)"
# S3 down after the suspend's test of the store: a store that takes a push's marks and answers
# 500 to everything else (a suspend's upload fails once the guest is stopped)
python3 "$SRC/tests/servers/marks_only.py" "$T/down.port" 500 &
at_exit "kill $!"
wait_for 5 test -s "$T/down.port" || fail "the failing store did not start"
DOWN="env AWS_ENDPOINT_URL=http://127.0.0.1:$(cat "$T/down.port") VMSNAP_S3_ATTEMPTS=2"

# vm_err STATE CMD...: run the vm command (expected to fail), its stderr in $T/err
vm_err() {
    local s=$1
    shift
    expect_fail "vm $*" vmc "$s" "$@"
}
# stop_at FAILPOINT STATE ARGS...: a vm command run until it stops at FAILPOINT ($SPID)
stop_at() {
    local fp=$1 s=$2
    shift 2
    VMSNAP_FAILPOINT=$fp:stop "$VMSNAP" vm "$@" --state-dir "$s" 2>"$T/err" &
    SPID=$!
    wait_stopped "$SPID" 60 || { fail "vm $* did not stop at $fp: $(cat "$T/err")"; kill_wait "$SPID"; return 1; }
}
go_on() { kill -CONT "$SPID"; grc=0 && wait "$SPID" || grc=$?; }
# killed_at FAILPOINT STATE ARGS...: a vm command killed at FAILPOINT
killed_at() {
    local fp=$1 s=$2 rc=0
    shift 2
    VMSNAP_FAILPOINT=$fp "$VMSNAP" vm "$@" --state-dir "$s" 2>"$T/kerr" || rc=$?
    [ "$rc" = 137 ] || fail "vm $* did not die at $fp: exit $rc: $(cat "$T/kerr")"
}
kill_qemu() {
    local p
    p=$(cat "$1/vms/$2/pid")
    kill -9 "$p"
    wait_for 10 gone "$p" || fail "QEMU $p of $2 does not die"
}
# gone PID: no such process (or a zombie nobody reaped yet)
gone() { [ ! -e "/proc/$1" ] || [ "$(ps -o stat= -p "$1" | cut -c1)" = Z ]; }
# runs STATE NAME CMD [RAM0]: run the advised CMD (a resume) in STATE; the guest must run (a
# counter line after it, past RAM0 when given: the state it resumed is not older) with the RAM
# blob it booted with
runs() {
    local s=$1 n=$2 from got
    from=$(con_lines "$s" "$n")
    VMSNAP_STATE_DIR=$s run_advised "$n" "$3" || return 1
    wait_console "$s" "$n" "$from" 'vmsnap-counter ram=' 60 || return 1
    got=$(counter_after "$s" "$n" "$from")
    [ -z "${4:-}" ] || [ "${got% *}" -gt "$4" ] || fail "'$3' resumed an older state: RAM counter ${got% *}, was $4"
    [ "$(blob_md5 "$s" "$n")" = "$boot_md5" ] || { fail "'$3': RAM blob md5 differs from the boot's"; return 1; }
}
ram_now() { last_counter "$1" "$2" | cut -d' ' -f1; }
# run_in STATE CMD: run the advised (non-resume) CMD in STATE
run_in() { VMSNAP_STATE_DIR=$1 run_advised "${3:-vm}" "$2"; }

resume_check "$A" golden "$golden_ram" "$golden_data" || done_tests

# --- incoming (lib/vm/vm_suspend.c): a resume killed while its QEMU waited for the state; pause
# and suspend say resume, which starts it again from the same checkpoint
vmc "$A" pause golden || fail "pause"
r0=$(ram_now "$A" golden)
killed_at resume-incoming "$A" resume golden
vm_err "$A" pause golden
c1=$(advised "$T/err" "vmsnap vm resume") && grep -q "is incoming, not running" "$T/err" || fail "pause of an incoming VM: $(cat "$T/err")"
vm_err "$A" suspend golden "$ST/in"
c2=$(advised "$T/err" "vmsnap vm resume") && grep -q "is incoming, not running" "$T/err" || fail "suspend of an incoming VM: $(cat "$T/err")"
[ "${c1:-}" = "vmsnap vm resume golden" ] && [ "$c1" = "${c2:-}" ] && runs "$A" golden "$c1" "$r0" && advice_seen incoming

# --- QEMU dead, a checkpoint here (lib/vm/vm_suspend.c): resume goes back to it
kill_qemu "$A" golden
vm_err "$A" pause golden
c=$(advised "$T/err" "vmsnap vm resume") && grep -q "goes back to its last checkpoint" "$T/err" &&
    runs "$A" golden "$c" && advice_seen dead_ckpt || fail "pause of a dead VM: $(cat "$T/err")"

# --- frozen (lib/vm/vm_resume.c): a resume killed after the restore leaves QEMU holding the guest
# stopped; a resume without a URL lets it run on there, one from a URL is refused, advising that
# resume, or a stop and then a resume
for how in resume stop; do
    vmc "$A" pause golden || fail "pause"
    killed_at resume-restored "$A" resume golden
    vm_err "$A" resume golden "$ST/frozen-url"
    c=$(advised "$T/err" "vmsnap vm $how") && grep -q "is frozen" "$T/err" || { fail "resume from a URL of a frozen VM: $(cat "$T/err")"; continue; }
    if [ $how = resume ]; then
        runs "$A" golden "$c" && advice_seen frozen
    else
        run_in "$A" "$c" && runs "$A" golden "vmsnap vm resume golden" && advice_seen frozen
    fi
done

# --- a pause whose checkpoint the filesystem refuses once QEMU stopped (lib/vm/vm_suspend.c),
# then a stop (lib/vm/vm_stop.c) and a suspend (lib/vm/vm_recover.c) while it still refuses:
# fixed, resume completes that checkpoint and the guest goes on from it
sleep 1
if stop_at pause-taken "$A" pause golden; then
    immutable "$V/checkpoint.new"
    go_on
    r0=$(ram_now "$A" golden)
    is_failure "$grc" && c1=$(advised "$T/err" "vmsnap vm resume") && grep -q "VM stopped; the state it took is kept in $V/checkpoint.new" "$T/err" ||
        fail "pause refused its checkpoint: exit $grc: $(cat "$T/err")"
    vmc "$A" stop golden 2>"$T/err" || fail "stop of a VM with an unfinished checkpoint: $(cat "$T/err")"
    c2=$(advised "$T/err" "vmsnap vm resume") && grep -q "completes it once that is fixed" "$T/err" ||
        fail "stop of a VM with an unfinished checkpoint: $(cat "$T/err")"
    vm_err "$A" suspend golden "$ST/pu"
    c3=$(advised "$T/err" "vmsnap vm resume") && grep -q "which completes it first" "$T/err" ||
        fail "suspend of a VM with an unfinished checkpoint: $(cat "$T/err")"
    mutable "$V/checkpoint.new"
    [ "${c1:-}" = "vmsnap vm resume golden" ] && [ "${c2:-}" = "$c1" ] && [ "${c3:-}" = "$c1" ] &&
        runs "$A" golden "$c1" "$r0" && [ ! -e "$V/checkpoint.new" ] && advice_seen pause_unfinished
fi

# --- a suspend whose stage refuses the RAM once QEMU stopped (lib/vm/vm_suspend.c): resume makes
# it the checkpoint it was to be, and the guest goes on from it
sleep 1
stage=$VMSNAP_RAM_DIR/$(basename "$(jget "$V/vm.json" 'j["ram_path"]')" .ram).stage
if stop_at suspend-taken "$A" suspend golden "$ST/st"; then
    immutable "$stage"
    go_on
    mutable "$stage"
    r0=$(ram_now "$A" golden)
    is_failure "$grc" && c=$(advised "$T/err" "vmsnap vm resume") && grep -q "the VM is stopped; the state it took is kept in $stage" "$T/err" &&
        runs "$A" golden "$c" "$r0" && advice_seen suspend_taken || fail "suspend whose stage refused the RAM: $(cat "$T/err")"
fi

# --- a suspend whose disk copy fails (the live disk away) and whose local checkpoint the VM's
# directory refuses (lib/vm/vm_suspend.c): the incomplete stage is completed by resume once the
# disk is back and the directory writable
sleep 1
if stop_at suspend-taken "$A" suspend golden "$ST/si"; then
    mv "$V/disk-vda.ext4" "$T/disk.away"
    immutable "$V"
    go_on
    mutable "$V"
    mv "$T/disk.away" "$V/disk-vda.ext4"
    r0=$(ram_now "$A" golden)
    is_failure "$grc" && c=$(advised "$T/err" "vmsnap vm resume") && grep -q "incomplete (no rootfs-disk-vda.ext4)" "$T/err" &&
        runs "$A" golden "$c" "$r0" && advice_seen stage_incomplete || fail "suspend with an incomplete stage: $(cat "$T/err")"
fi

# --- a suspend whose record the VM's directory refuses after the push (lib/vm/vm_suspend.c):
# resume restores the stage; and, in the same state again, resume from the URL it names
for how in stage url; do
    sleep 1
    stop_at suspend-staged "$A" suspend golden "$ST/rec-$how" || continue
    immutable "$V"
    go_on
    mutable "$V"
    r0=$(ram_now "$A" golden)
    grep -q "the VM's record could not be updated" "$T/err" || { fail "suspend whose record was refused: $(cat "$T/err")"; continue; }
    if [ $how = stage ]; then
        c=$(advised "$T/err" "vmsnap vm resume golden")
    else
        c=$(advised "$T/err" "vmsnap vm resume golden $ST/rec-url")
    fi
    [ -n "$c" ] && runs "$A" golden "$c" "$r0" && advice_seen record_failed
done

# --- S3 down during a suspend (lib/vm/vm_suspend.c): the checkpoint is kept; resume it, or (the
# same state again) suspend it to the store once it is up, and resume from there
for how in resume suspend; do
    sleep 1
    r0=$(ram_now "$A" golden)
    expect_fail "suspend with S3 down" $DOWN "$VMSNAP" vm suspend golden "$B/down" --state-dir "$A"
    grep -q "upload failed; the VM is stopped and its checkpoint kept locally" "$T/err" || { fail "suspend with S3 down: $(cat "$T/err")"; continue; }
    if [ $how = resume ]; then
        c=$(advised "$T/err" "vmsnap vm resume") && runs "$A" golden "$c" "$r0" && advice_seen upload_failed
    else
        c=$(advised "$T/err" "vmsnap vm suspend") && run_in "$A" "$(placeholder URL "$B/vm-a" "$c")" &&
            [ "$(head_code vm-a/manifest.json)" = 200 ] && runs "$A" golden "vmsnap vm resume golden" "$r0" &&
            advice_seen upload_failed
    fi
done

# --- QEMU dead, no checkpoint here (it came from the store) (lib/vm/vm_suspend.c): resume from
# the store (the URL its record names), or (the same state again) stop --rm
for how in resume rm; do
    url=$(jget "$V/vm.json" 'j["url"]')
    [ -e "$V/checkpoint" ] && fail "the VM resumed from $url has a local checkpoint"
    kill_qemu "$A" golden
    vm_err "$A" pause golden
    grep -q "and no checkpoint here" "$T/err" || { fail "pause of a dead VM without checkpoint: $(cat "$T/err")"; continue; }
    if [ $how = resume ]; then
        c=$(advised "$T/err" "vmsnap vm resume") && runs "$A" golden "$(placeholder URL "$url" "$c")" && advice_seen dead_no_ckpt
    else
        c=$(advised "$T/err" "vmsnap vm stop --rm") && run_in "$A" "$c" && [ ! -e "$V" ] &&
            ! ls "$VMSNAP_RAM_DIR" | grep -q -- '-golden\.ram$' && advice_seen dead_no_ckpt ||
            fail "'${c:-}' left: $(ls -A "$V" "$VMSNAP_RAM_DIR" 2>&1)"
    fi
done

# a second copy of the golden state
C=$T/c
from_golden "$C"
W=$C/vms/golden
resume_check "$C" golden "$golden_ram" "$golden_data" || done_tests

# --- a suspend killed during its upload leaves the only copy in the stage; a resume from a URL
# says so (lib/vm/vm_resume.c): resume from the stage, or (the same state again) store it
for how in resume suspend; do
    sleep 1
    r0=$(ram_now "$C" golden)
    killed_at suspend-staged "$C" suspend golden "$ST/killed"
    vm_err "$C" resume golden "$B/vm-a"
    grep -q "its last suspend could not store" "$T/err" || { fail "resume URL over an unsaved stage: $(cat "$T/err")"; continue; }
    if [ $how = resume ]; then
        c=$(advised "$T/err" "vmsnap vm resume") && runs "$C" golden "$c" "$r0" && advice_seen unsaved_stage
    else
        c=$(advised "$T/err" "vmsnap vm suspend") && run_in "$C" "$(placeholder URL "$ST/unsaved" "$c")" &&
            runs "$C" golden "vmsnap vm resume golden" "$r0" && advice_seen unsaved_stage
    fi
done

# --- a suspend whose upload fails (S3 down) and whose local checkpoint the VM's directory
# refuses (lib/vm/vm_suspend.c): the marked stage is pushed by the suspend it advises
sleep 1
r0=$(ram_now "$C" golden)
VMSNAP_FAILPOINT=suspend-staged:stop $DOWN "$VMSNAP" vm suspend golden "$B/down2" --state-dir "$C" 2>"$T/err" &
SPID=$!
if wait_stopped "$SPID" 60; then
    immutable "$W"
    go_on
    mutable "$W"
    is_failure "$grc" && c=$(advised "$T/err" "vmsnap vm suspend") && grep -q "again to store it" "$T/err" &&
        run_in "$C" "$(placeholder URL "$B/vm-c" "$c")" && [ "$(head_code vm-c/manifest.json)" = 200 ] &&
        runs "$C" golden "vmsnap vm resume golden" "$r0" && advice_seen stage_kept ||
        fail "suspend with S3 down and no room for a checkpoint: exit $grc: $(cat "$T/err")"
else
    fail "the suspend did not stop at suspend-staged: $(cat "$T/err")"
    kill_wait "$SPID"
fi

# --- a suspend whose test of the store leaves its test object (lib/xfer/xfer_push.c: only a
# suspend tests a store before its push, so advice.sh's table gives this message to this case):
# the store takes the object and refuses its removal (the proxy answers the DELETE 503, one
# attempt); the suspend goes on and stores the set; gc, past the grace period (an S3 object's
# age cannot be faked: --older-than 0), removes the object, and the set pulls whole
sleep 1
r0=$(ram_now "$C" golden)
start_proxy "2:503"
rc=0 && AWS_ENDPOINT_URL=$PEP VMSNAP_S3_ATTEMPTS=1 "$VMSNAP" vm suspend golden "$B/probe" --state-dir "$C" 2>"$T/err" || rc=$?
stop_proxy
left=$(keys_under probe/ | grep -c '/vmsnap-push-[0-9a-f]*\.json$' || true)
if [ "$rc" = 0 ] && c=$(advised "$T/err" "vmsnap gc") && grep -q "$B/probe: cannot remove the test object vmsnap-push-" "$T/err" &&
    [ "$left" = 1 ] && [ "$(head_code probe/manifest.json)" = 200 ]; then
    run_advised "test object left" "$c $B/probe" && grep -q "kept" "$T/adv.err" ||
        fail "'$c $B/probe' did not find the test object: $(cat "$T/adv.err")"
    "$VMSNAP" -q gc --older-than 0 "$B/probe" 2>"$T/gc.err" || fail "gc --older-than 0 $B/probe: $(cat "$T/gc.err")"
    [ "$(keys_under probe/ | grep -c '/vmsnap-push-' || true)" = 0 ] || fail "gc left the test object: $(keys_under probe/)"
    runs "$C" golden "vmsnap vm resume golden" "$r0" && advice_seen probe_left
else
    fail "suspend whose test object could not be removed: exit $rc, $left left: $(cat "$T/err")"
    vmc "$C" resume golden >/dev/null 2>&1 || true
fi

# --- a VM that ran with another RAM directory, its QEMU dead, suspended from its checkpoint
# (lib/vm/vm_suspend.c): its RAM file stays, and stop with that directory removes it
vmc "$C" pause golden && vmc "$C" resume golden >/dev/null || fail "pause and resume"
kill_qemu "$C" golden
Y=$(mktemp -d /dev/shm/vmsnap-test.XXXXXX)
at_exit "rm -rf '$Y'"
VMSNAP_RAM_DIR=$Y "$VMSNAP" vm suspend golden "$ST/other" --state-dir "$C" 2>"$T/err" || fail "suspend with another RAM dir: $(cat "$T/err")"
rp=$(sed -n "s/.*its dead QEMU's RAM file \(.*\) stays (it ran with another --ram-dir).*/\1/p" "$T/err")
c=$(advised "$T/err" "vmsnap vm stop golden --ram-dir") && [ -f "$rp" ] &&
    run_in "$C" "$(placeholder DIR "$(dirname "$rp")" "$c")" && [ ! -e "$rp" ] && advice_seen other_ram_dir ||
    fail "the dead QEMU's RAM file in another RAM dir ('$rp'): $(cat "$T/err")"

# --- a VM that never had a checkpoint or a store, its QEMU dead (lib/vm/vm_resume.c): resume it
# from a store (a set of the golden), or (the same state again) stop --rm it
G=$(guest_dir)
for how in resume rm; do
    vmc "$C" run fresh --kernel "$G/vmlinux" --initrd "$G/initrd.cpio.gz" --mem "$VM_MEM" \
        --disk-size 64M --append "$(cat "$G/cmdline")" >/dev/null || { fail "vm run fresh"; continue; }
    wait_console "$C" fresh 0 'vmsnap-counter ram=' 120 || continue
    kill_qemu "$C" fresh
    vm_err "$C" resume fresh
    grep -q "has no local checkpoint in" "$T/err" || { fail "resume of a VM without checkpoint: $(cat "$T/err")"; continue; }
    if [ $how = resume ]; then
        c=$(advised "$T/err" "vmsnap vm resume") && runs "$C" fresh "$(placeholder URL "$B/vm-c" "$c")" && advice_seen no_ckpt
        vmc "$C" stop --rm fresh || fail "stop --rm fresh"
    else
        c=$(advised "$T/err" "vmsnap vm stop --rm") && run_in "$C" "$c" && [ ! -e "$C/vms/fresh" ] && advice_seen no_ckpt ||
            fail "'${c:-}' left: $(ls -A "$C/vms/fresh" 2>&1)"
    fi
done

# --- a QEMU that does not answer (stopped by SIGSTOP) (lib/vm/vm_resume.c): stop ends it
# (each QMP question waits 60 s for its answer first)
vmc "$C" resume golden >/dev/null || fail "resume from $ST/other"
qp=$(cat "$W/pid")
kill -STOP "$qp"
at_exit "kill -CONT $qp 2>/dev/null"
vm_err "$C" resume golden
c=$(advised "$T/err" "vmsnap vm stop") && grep -q "cannot tell whether its QEMU still runs" "$T/err" &&
    run_in "$C" "$c" && wait_for 10 gone "$qp" && advice_seen qemu_mute ||
    fail "resume beside a QEMU that does not answer: $(cat "$T/err") / $(cat "$T/adv.err" 2>/dev/null)"

advice_check_seen
done_tests
