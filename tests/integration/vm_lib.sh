# SPDX-License-Identifier: Apache-2.0
# Shared by the VM tests: the counter guest (guest/build.sh), the golden checkpoint made once per
# ctest run by vm_golden.sh, and helpers that read the guest's serial console.
# Every VM a test starts lives under a state directory listed in VM_DIRS; the EXIT trap stops
# them all (and removes their RAM files), whatever happened.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/lib.sh"
command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 not installed (scripts/deps.sh vm)"
command -v e2fsck >/dev/null || skip "e2fsck not installed"
GOLDEN=${VMSNAP_BUILD:?}/vm-golden
VM_DIRS=()
# A RAM directory of this test's own on /dev/shm: the checks that a failure left nothing there
# see this test's files only, not those of another test run on the machine.
OWN_RAM_DIR=
if [ -z "${VMSNAP_RAM_DIR:-}" ]; then
    OWN_RAM_DIR=$(mktemp -d /dev/shm/vmsnap-test.XXXXXX)
    export VMSNAP_RAM_DIR=$OWN_RAM_DIR
fi
# a resume from a store runs the set's kernel and initrd only from the node's asset directories:
# here, the guest's build directory (guest/build.sh)
export VMSNAP_ASSET_DIRS=${VMSNAP_ASSET_DIRS:-${VMSNAP_GUEST_DIR:-/var/cache/vmsnap-guest}}
# QEMU and the guest run under TCG here: keep the guest small.
VM_MEM=${VM_MEM:-256M}

# (the first exit handler: a test's own, such as an unmount of what its VMs use, come after)
vm_stop_all() {
    local d n
    for d in ${VM_DIRS[@]+"${VM_DIRS[@]}"}; do
        [ -d "$d/vms" ] || continue
        for n in $(ls "$d/vms"); do
            "$VMSNAP" vm stop --rm --state-dir "$d" "$n" >/dev/null 2>&1 || true
        done
    done
    [ -z "$OWN_RAM_DIR" ] || rm -rf "$OWN_RAM_DIR"
}
at_exit vm_stop_all

guest_dir() { # build (or reuse) the guest; skip when it cannot be built here
    local g
    g=$(bash "$SRC/guest/build.sh" 2>"$T/guest.err") ||
        skip "cannot build the test guest: $(tail -n 3 "$T/guest.err")"
    echo "$g"
}

# vmc STATE ARGS...: the CLI against one state directory
vmc() {
    local s=$1
    shift
    "$VMSNAP" vm "$@" --state-dir "$s"
}

con_log() { echo "$1/vms/$2/console.log"; }
# con_lines STATE NAME: the lines in the console log, a last one without its newline included (a
# QEMU stopped mid-line: the next QEMU's output starts on a new line, and that old line must not
# be read as the first one after a resume)
con_lines() {
    local f n
    f=$(con_log "$1" "$2")
    [ -s "$f" ] || { echo 0; return; }
    n=$(wc -l <"$f")
    [ "$(tail -c 1 "$f" | od -An -c | tr -d ' ')" = '\n' ] || n=$((n + 1))
    echo "$n"
}

# counter_after STATE NAME LINE: "RAM DATA" of the first counter line after line LINE, or nothing
counter_after() {
    tail -n +"$(($3 + 1))" "$(con_log "$1" "$2")" 2>/dev/null | tr -d '\r' |
        sed -n 's/.*vmsnap-counter ram=\([0-9]*\) *data=\([0-9-]*\) .*/\1 \2/p' | head -n1
}
# last_counter STATE NAME: "RAM DATA" of the last complete counter line
last_counter() {
    tr -d '\r' <"$(con_log "$1" "$2")" |
        sed -n 's/.*vmsnap-counter ram=\([0-9]*\) *data=\([0-9-]*\) blob=[0-9a-f]\{32\}$/\1 \2/p' |
        tail -n1
}
# wait_console STATE NAME LINE REGEX [SECONDS]: wait for a line matching REGEX after line LINE
wait_console() { # STATE NAME FROM RE [SECS] [quiet: no failure reported]
    local s=$1 n=$2 from=$3 re=$4 secs=${5:-60} quiet=${6:-} i
    for ((i = 0; i < secs * 5; i++)); do
        tail -n +"$((from + 1))" "$(con_log "$s" "$n")" 2>/dev/null | tr -d '\r' | grep -Eq "$re" &&
            return 0
        sleep 0.2
    done
    [ -n "$quiet" ] && return 1
    fail "$n: no console line matching '$re' within ${secs}s (last: $(tail -n 2 "$(con_log "$s" "$n")" | tr -d '\r'))"
    return 1
}
# blob_md5 STATE NAME: ask the guest to re-hash its RAM blob, print the result
blob_md5() {
    local from
    from=$(con_lines "$1" "$2")
    vmc "$1" console "$2" --send md5 || return 1
    if ! wait_console "$1" "$2" "$from" 'vmsnap-blob md5=' 30 quiet; then
        # a command can be lost on the guest's serial line (seen once in CI, under load):
        # asked again; the answer is still the hash of the blob as it is now
        vmc "$1" console "$2" --send md5 || return 1
        wait_console "$1" "$2" "$from" 'vmsnap-blob md5=' 60 || return 1
    fi
    tail -n +"$((from + 1))" "$(con_log "$1" "$2")" | tr -d '\r' |
        sed -n 's/.*vmsnap-blob md5=\([0-9a-f]*\).*/\1/p' | head -n1
}

# resume_check STATE NAME BEFORE_RAM BEFORE_DATA ARGS...: resume and check both counters went on
# from where they were (the next RAM tick; the file counter is past BEFORE_DATA)
resume_check() {
    local s=$1 n=$2 ram0=$3 data0=$4 from got ram data
    shift 4
    from=$(con_lines "$s" "$n")
    vmc "$s" resume "$n" "$@" >"$T/resume.out" 2>&1 || {
        fail "resume $n $*: $(cat "$T/resume.out")"
        return 1
    }
    wait_console "$s" "$n" "$from" 'vmsnap-counter ram=' 60 || return 1
    got=$(counter_after "$s" "$n" "$from")
    ram=${got% *}
    data=${got#* }
    # The next tick is ram0+1, or ram0+2 when the checkpoint caught the guest mid-way through
    # printing ram0+1 (that half line went to the old node's log).
    [ "$ram" -gt "$ram0" ] && [ "$ram" -le "$((ram0 + 2))" ] ||
        fail "resume $n $*: RAM counter $ram after $ram0 (expected $((ram0 + 1)))"
    [ "$data" -gt "$data0" ] 2>/dev/null || fail "resume $n $*: file counter $data after $data0"
}

# copied_said LOG: the bytes a -v push in LOG said the store copied from its base, over its files
copied_said() {
    sed -n 's/.*frames reused from the base: \([0-9]*\) bytes copied by the store.*/\1/p' "$1" |
        awk '{ s += $1 } END { print s + 0 }'
}

# suspend_same_base STATE BASE URL: pause the VM golden, push its checkpoint as the set BASE
# (in the frames a suspend gives a guest of $VM_MEM: 1/64 of it, at least 8 MiB) and suspend it
# to URL over that base: every frame is the base's, the store copies them, and --json's
# copied_bytes is what each file's push said it copied. Status 1 when it could not be done.
suspend_same_base() {
    local s=$1 mib copied
    case $VM_MEM in
    *G) mib=$((${VM_MEM%G} * 1024)) ;;
    *) mib=${VM_MEM%M} ;;
    esac
    mib=$((mib / 64 > 8 ? mib / 64 : 8))
    vmc "$s" pause golden || { fail "pause before the same-frames base"; return 1; }
    "$VMSNAP" -q push --frame-size "${mib}M" "$s/vms/golden/checkpoint" "$2" 2>/dev/null ||
        { fail "push of the checkpoint as a base"; return 1; }
    "$VMSNAP" -v vm suspend golden "$3" --base "$2" --json --state-dir "$s" >"$T/same.json" \
        2>"$T/same.err" || { fail "suspend over the same frames: $(cat "$T/same.err")"; return 1; }
    copied=$(copied_said "$T/same.err")
    [ "$copied" -gt 0 ] ||
        fail "a suspend over a base of the same frames copied nothing: $(cat "$T/same.err")"
    [ "$(jget "$T/same.json" "j['copied_bytes'] == $copied <= j['object_bytes']" 2>&1)" = True ] ||
        fail "copied_bytes is not the $copied bytes copied from the base: $(cat "$T/same.json")"
}

# from_golden STATE: a copy of the golden state directory (the VM 'golden', paused)
from_golden() {
    [ -f "$GOLDEN/golden.env" ] || skip "no golden checkpoint (vm_golden did not run or failed)"
    mkdir -p "$1"
    cp -a --sparse=always "$GOLDEN/state/." "$1/"
    VM_DIRS+=("$1")
    # shellcheck disable=SC1091
    . "$GOLDEN/golden.env"
}
