#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# suspend to the local store -> resume under another state directory (another "node"), four
# cycles in a row with the guest writing in between, eager and on demand: both counters go on,
# the RAM blob stays intact, and each suspend leaves no local state but the VM's record. Then a
# suspend over a base of the same frames: copied by the store, and counted.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/integration/vm_lib.sh"
# the reference layout's suspend cycle (objects at <set>/<name>.zstd, --base copies); layered
# suspends and resumes (deltas, chains, the cache) are tests/integration/vm_layers.sh
export VMSNAP_LAYOUT=reference
A=$T/node-a
B=$T/node-b
from_golden "$A"
VM_DIRS+=("$B")
STORE=$T/store
resume_check "$A" golden "$golden_ram" "$golden_data" || done_tests
ramfile=$(jget "$A/vms/golden/vm.json" 'j["ram_path"]')

here=$A there=$B
i=0
for mode in eager on-demand on-demand eager; do
    i=$((i + 1))
    sleep 2 # the guest writes its disk and RAM between cycles
    url=$STORE/golden-$i
    # a local store takes no base by default (its copies would be data copies); --base asks
    base=()
    [ $i = 3 ] && base=(--base "$STORE/golden-2")
    "$VMSNAP" -v vm suspend golden "$url" "${base[@]}" --json --state-dir "$here" >"$T/suspend.json" 2>"$T/suspend.err" ||
        { fail "cycle $i: suspend: $(cat "$T/suspend.err")"; break; }
    [ "$(jget "$T/suspend.json" 'j["op"] == "suspend" and "upload" in j["steps"]')" = True ] ||
        fail "cycle $i: suspend --json: $(cat "$T/suspend.json")"
    if [ $i = 3 ]; then
        grep "memory-ranges.zstd: [0-9]* of [0-9]* frames reused from the base" "$T/suspend.err" >&2 ||
            fail "cycle $i: --base was not used: $(cat "$T/suspend.err")"
    else
        grep -q "reused from the base" "$T/suspend.err" && fail "cycle $i: a local suspend used a base by default"
    fi
    # copied_bytes: what the store copied from the base, as each file's push said (reused runs
    # under the 5 MiB part minimum are fetched, not copied); nothing without a base
    copied=$(copied_said "$T/suspend.err")
    [ "$(jget "$T/suspend.json" "j['copied_bytes'] == $copied <= j['object_bytes']" 2>&1)" = True ] ||
        fail "cycle $i: copied_bytes is not the $copied bytes the push copied: $(cat "$T/suspend.json")"
    [ $i = 3 ] || [ "$copied" = 0 ] || fail "cycle $i: $copied bytes copied from no base"
    [ -f "$url/manifest.json" ] || fail "cycle $i: no manifest at $url"
    for f in memory-ranges state config.json base-id rootfs-disk-vda.ext4; do
        [ -f "$url/$f.zstd" ] || fail "cycle $i: $f.zstd not in the store"
    done
    # frames sized to the guest ($VM_MEM / 64, at least 8 MiB), not the codec's 64 MiB default
    "$VMSNAP" inspect --json "$url/memory-ranges.zstd" >"$T/insp.json" 2>&1 &&
        grep -q '"frame_bytes":8388608,' "$T/insp.json" ||
        fail "cycle $i: memory image frames: $(cat "$T/insp.json")"
    [ ! -e "$here/vms/golden/checkpoint" ] && [ ! -e "$here/vms/golden/disk-vda.ext4" ] ||
        fail "cycle $i: local checkpoint or disk left after a successful suspend"
    [ ! -e "$ramfile" ] || fail "cycle $i: RAM file left after suspend"
    ls "$VMSNAP_RAM_DIR" | grep -q 'golden\.stage' && fail "cycle $i: staging left on tmpfs"
    vmc "$here" ls | grep -Eq "^golden +suspended .*$url" || fail "cycle $i: ls: $(vmc "$here" ls)"
    read -r r d <<<"$(last_counter "$here" golden)"
    # the other node has its own record (or none yet); the store's snapshot replaces it
    vmc "$there" stop --rm golden >/dev/null 2>&1 || true
    opt=()
    [ "$mode" = on-demand ] && opt=(--on-demand)
    resume_check "$there" golden "$r" "$d" "$url" "${opt[@]}" || break
    if [ "$mode" = on-demand ]; then
        [ -f "$there/vms/golden/ondemand/memory-ranges" ] ||
            fail "cycle $i: on-demand image not kept for the VM's life"
        [ ! -e "$there/vms/golden/ondemand/state" ] || fail "cycle $i: pulled state not released"
    else
        [ ! -e "$there/vms/golden/ondemand" ] || fail "cycle $i: eager resume left ondemand/"
    fi
    ls "$VMSNAP_RAM_DIR" | grep -q 'golden\.stage' && fail "cycle $i: pulled staging left on tmpfs"
    ramfile=$(jget "$there/vms/golden/vm.json" 'j["ram_path"]')
    t=$here
    here=$there
    there=$t
done
[ "$(blob_md5 "$here" golden)" = "$boot_md5" ] || fail "RAM blob md5 changed over the cycles"
# the base-id (lineage) survived every hop
base_id=$(jget "$GOLDEN/state/vms/golden/vm.json" 'j["base_id"]')
[ -n "$base_id" ] && [ "$(jget "$here/vms/golden/vm.json" 'j["base_id"]')" = "$base_id" ] ||
    fail "base_id changed (or the golden has none)"
# a suspend over a base holding the same frames: the store copies them, and copied_bytes counts
# them
suspend_same_base "$here" "$STORE/same" "$STORE/same-2" || done_tests
read -r r d <<<"$(last_counter "$here" golden)"
vmc "$there" stop --rm golden >/dev/null 2>&1 || true
resume_check "$there" golden "$r" "$d" "$STORE/same-2" || done_tests
[ "$(blob_md5 "$there" golden)" = "$boot_md5" ] || fail "RAM blob md5 after a suspend over the same frames"
done_tests
