#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# A real guest's life through vmsnapd (docs/daemon.md): run (the counter guest, kernel and
# initrd from the node's asset directory), suspend to a local store and resume from it, suspend
# to the test RGW through a profile configured on the node and resume from it (the daemon's
# environment has no AWS keys: a suspend naming no profile is refused by the store and loses
# nothing), pause, resume, stop and stop --rm. After each step both guest counters go on and the
# guest's RAM blob keeps its md5; GET /v1/vms/NAME shows the state, the sizes, the set the VM
# came from and the last operation with the library's step timings. Two operations on one VM at
# once: the second is 409 naming the first (a worker held by a pull from a silent store keeps
# the first queued, so no timing decides it).
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/integration/vm_lib.sh"
. "$VMSNAP_SRC/tests/integration/xfer_s3_lib.sh"
. "$VMSNAP_SRC/tests/integration/daemon_lib.sh"
G=$(guest_dir)
R=$T/root
S=$R/state
mkdir -p "$S" "$R/store"
VM_DIRS+=("$S")

# a store that accepts connections and never answers: an operation on it holds its worker
python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(16)
open(sys.argv[1], "w").write(str(s.getsockname()[1]))
held = []
while True: held.append(s.accept())' "$T/silent.port" &
SILENT=$!
at_exit "kill $SILENT"
wait_for 5 test -s "$T/silent.port" || fail "the silent store did not start"

daemon_profile rgwkeys "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY"
daemon_profile hangkeys AKIDHANG notasecret
DAEMON_ENV=("AWS_ENDPOINT_URL=$AWS_ENDPOINT_URL")
daemon_start --set "root=$R" --set "asset_dir=$G" --set "state_dir=$S" \
    --set "ram_dir=$VMSNAP_RAM_DIR" --set "cache_dir=$R/cache" --set workers=1 \
    --set "profile=rgw aws=rgwkeys endpoint=$AWS_ENDPOINT_URL region=us-east-1 path_style" \
    --set "profile=hang aws=hangkeys endpoint=http://127.0.0.1:$(cat "$T/silent.port") region=us-east-1 path_style" ||
    done_tests

mem=$((256 << 20))
append="$(cat "$G/cmdline") vmsnap.dirty=16"
body=$(python3 -c 'import json, sys
print(json.dumps({"name": "g1", "kernel": sys.argv[1] + "/vmlinux",
                  "initrd": sys.argv[1] + "/initrd.cpio.gz", "append": sys.argv[2],
                  "memory_bytes": int(sys.argv[3]), "disk_size_bytes": int(sys.argv[3])}))' \
    "$G" "$append" "$mem")
dop POST /v1/vms "$body" || done_tests
[ "$(opj 'j["kind"] + " " + j["target"] + " " + j["result"]["op"]')" = "vm.run vm:g1 run" ] ||
    fail "run: $(cat "$T/op.json")"
wait_console "$S" g1 0 'vmsnap-counter ram=3 ' 120 || done_tests
boot_md5=$(tr -d '\r' <"$(con_log "$S" g1)" | sed -n 's/.*vmsnap-ready .*blob=\([0-9a-f]*\).*/\1/p')
[ ${#boot_md5} = 32 ] || fail "no blob md5 in the guest's ready line"

# info_check WHAT EXPR: GET /v1/vms/g1, and EXPR over its `vm` must hold
info_check() {
    local st
    st=$(dapi GET /v1/vms/g1)
    [ "$st" = 200 ] || { fail "$1: GET /v1/vms/g1: $st $(head -c 300 "$T/resp")"; return 1; }
    dschema VmInfo
    [ "$(jget "$T/resp" "(lambda v: $2)(j['vm'])" 2>&1)" = True ] ||
        fail "$1: vm info does not hold '$2': $(cat "$T/resp")"
}
# the last operation in the VM's info is the operation just waited for, with its step timings
last_is() {
    local id kind
    id=$(opj 'j["id"]')
    kind=$(opj 'j["kind"]')
    info_check "$1" "v['last_operation']['id'] == '$id' and v['last_operation']['kind'] == '$kind' \
and v['last_operation']['state'] == 'done' and v['operation'] is None \
and v['last_operation']['result']['steps'] == $(opj 'j["result"]["steps"]') \
and len(v['last_operation']['result']['steps']) > 0"
    [ "$kind" = vm.stop ] && return
    opj 'json.dumps(j["result"])' >"$T/resp"
    dschema VmTiming
}
info_check "after run" "v['status'] == 'running' and v['pid'] > 0 and v['sizes']['memory_bytes'] == $mem \
and v['sizes']['disk_bytes'] == $mem and 0 < v['sizes']['allocated_bytes'] < $mem \
and v['sizes']['checkpoint_bytes'] == 0 and v['url'] is None"
last_is "after run"
[ "$(opj '"boot" in j["result"]["steps"]')" = True ] || fail "run's steps: $(cat "$T/op.json")"

# api_resume BODY BEFORE_RAM BEFORE_DATA: resume g1 through the API; both counters go on from
# where they were (as resume_check does for the CLI)
api_resume() {
    local from got ram data
    from=$(con_lines "$S" g1)
    dop POST /v1/vms/g1/resume "$1" || return 1
    wait_console "$S" g1 "$from" 'vmsnap-counter ram=' 60 || return 1
    got=$(counter_after "$S" g1 "$from")
    ram=${got% *}
    data=${got#* }
    [ "$ram" -gt "$2" ] && [ "$ram" -le "$(($2 + 2))" ] ||
        fail "resume $1: RAM counter $ram after $2"
    [ "$data" -gt "$3" ] 2>/dev/null || fail "resume $1: file counter $data after $3"
}

# suspend to the local store, resume from it
sleep 1
dop POST /v1/vms/g1/suspend "{\"url\":\"$R/store/s1\"}" || done_tests
[ "$(opj '"upload" in j["result"]["steps"] and j["result"]["object_bytes"] > 0')" = True ] ||
    fail "a local suspend's result: $(cat "$T/op.json")"
[ -f "$R/store/s1/manifest.json" ] || fail "no manifest in the local store after the suspend"
read -r r d <<<"$(last_counter "$S" g1)"
info_check "after a local suspend" "v['status'] == 'suspended' and v['url'] == '$R/store/s1' \
and v['checkpoint'] is False and v['sizes']['disk_bytes'] == 0"
last_is "after a local suspend"
# (with a readiness wait: the operation ends once the guest printed its next counter line)
api_resume "{\"url\":\"$R/store/s1\",\"ready\":\"vmsnap-counter ram=\",\"ready_timeout_seconds\":120}" "$r" "$d" ||
    done_tests
[ "$(opj '"ready" in j["result"]["steps"]')" = True ] || fail "a resume with ready: no step 'ready': $(cat "$T/op.json")"
last_is "after a resume from the local store"
info_check "after a resume from the local store" "v['status'] == 'running' and v['url'] == '$R/store/s1'"
[ "$(blob_md5 "$S" g1)" = "$boot_md5" ] || fail "RAM blob md5 after the local store round trip"

# to the RGW through the profile; then the same without a profile: the daemon has no keys of
# its own, the store refuses, the VM keeps its checkpoint (paused) and the secret is in no error
sleep 1
dop POST /v1/vms/g1/suspend "{\"url\":\"s3://$BUCKET/vm1\",\"profile\":\"rgw\"}" || done_tests
[ "$(head_code vm1/manifest.json)" = 200 ] || fail "no manifest in the bucket after the suspend"
read -r r d <<<"$(last_counter "$S" g1)"
info_check "after a suspend to RGW" "v['status'] == 'suspended' and v['url'] == 's3://$BUCKET/vm1'"
last_is "after a suspend to RGW"
api_resume "{\"url\":\"s3://$BUCKET/vm1\",\"profile\":\"rgw\"}" "$r" "$d" || done_tests
[ "$(opj 'j["result"]["object_bytes"] > 0 and "download" in j["result"]["steps"]')" = True ] ||
    fail "a resume from RGW's result: $(cat "$T/op.json")"
[ "$(blob_md5 "$S" g1)" = "$boot_md5" ] || fail "RAM blob md5 after the RGW round trip"

sleep 1
dop POST /v1/vms/g1/pause '{}' || done_tests
read -r r d <<<"$(last_counter "$S" g1)"
info_check "after pause" "v['status'] == 'paused' and v['checkpoint'] is True \
and v['sizes']['checkpoint_bytes'] > (16 << 20) and v['pid'] == 0"
last_is "after pause"
id=$(dsubmit POST /v1/vms/g1/suspend "{\"url\":\"s3://$BUCKET/nokeys\"}") || done_tests
dwait "$id" && fail "a suspend to RGW without a profile succeeded: $(cat "$T/op.json")"
grep -q "$AWS_SECRET_ACCESS_KEY" "$T/op.json" "$DLOG" && fail "the secret key is in an answer or the log"
[ "$(head_code nokeys/manifest.json)" = 404 ] || fail "a suspend without a profile stored a manifest"
info_check "after a refused suspend" "v['status'] == 'paused' and v['checkpoint'] is True \
and v['last_operation']['state'] == 'failed'"

# two operations on one VM: the worker held by a pull from the silent store, a resume of g1
# queued behind it (submitted once the pull runs: queued first, the resume would go first); a
# pause and a stop of g1 are 409 naming the resume
blk=$(dsubmit POST /v1/sets/pull "{\"url\":\"s3://bkt/s\",\"path\":\"$R/blocked\",\"profile\":\"hang\"}") ||
    done_tests
blk_running() { [ "$(dapi GET "/v1/operations/$blk")" = 200 ] && [ "$(dj 'j["operation"]["state"]')" = running ]; }
wait_for 30 blk_running || fail "the pull from the silent store is not running: $(cat "$T/resp")"
first=$(dsubmit POST /v1/vms/g1/resume '{}') || done_tests
for a in pause stop; do
    st=$(dapi POST /v1/vms/g1/$a '{}')
    [ "$st" = 409 ] && [ "$(dj "j['error']['class'] == 'conflict' and '$first' in j['error']['message'] \
and j['operation']['id'] == '$first' and j['operation']['kind'] == 'vm.resume'")" = True ] ||
        fail "a $a while a resume is queued on g1: $st $(cat "$T/resp")"
done
info_check "with a resume queued" "v['operation']['id'] == '$first' and v['operation']['state'] == 'queued'"
st=$(dapi DELETE "/v1/operations/$blk")
[ "$st" = 202 ] || [ "$st" = 200 ] || fail "DELETE of the blocking pull: $st"
from=$(con_lines "$S" g1)
dwait "$first" || fail "the queued resume: $(cat "$T/op.json")"
wait_console "$S" g1 "$from" 'vmsnap-counter ram=' 60 || done_tests
got=$(counter_after "$S" g1 "$from")
[ "${got% *}" -gt "$r" ] || fail "resume after the 409s: RAM counter ${got% *} after $r"
[ "$(blob_md5 "$S" g1)" = "$boot_md5" ] || fail "RAM blob md5 after pause/resume"

# a graceful stop: the guest gets the power button and powers off by itself
from=$(con_lines "$S" g1)
dop POST /v1/vms/g1/stop '{"timeout_seconds":120}' || done_tests
[ "$(opj 'j["result"]["graceful"] is True')" = True ] || fail "a stop with timeout_seconds: $(cat "$T/op.json")"
wait_console "$S" g1 "$from" 'vmsnap-poweroff acpi' 5 || fail "the guest did not see its power button"
info_check "after stop" "v['status'] == 'stopped' and v['pid'] == 0"
pgrep -f "$S/vms/g1/qmp.sock" >/dev/null && fail "QEMU still runs after stop"
dop POST /v1/vms/g1/stop '{"remove":true}' || done_tests
[ "$(dapi GET /v1/vms/g1)" = 404 ] || fail "GET of a removed VM: $(cat "$T/resp")"
[ ! -e "$S/vms/g1" ] || fail "stop --rm left $S/vms/g1"
daemon_stop || fail "vmsnapd did not stop cleanly (exit $?)"
done_tests
