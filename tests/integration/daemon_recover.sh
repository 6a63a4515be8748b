#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# vmsnapd killed (SIGKILL, through the VMSNAP_FAILPOINT test hook: the daemon kills itself at
# that point of the library call) in the middle of its operations, then restarted: before it
# serves, its journal's recovery (daemon/recover.c, docs/daemon.md "Service life") settles
# what was interrupted. Kill moments, on a copy of the golden VM (paused) and a local store:
#   a resume after QEMU restored the guest (frozen), a suspend after its stage was taken
#   (unsaved), one after every object of its push was stored but not the manifest, one after
#   its manifest was committed but not the record, one in its teardown (suspended, the
#   checkpoint not yet gone), a resume from the store before QEMU starts, a set push over a set
#   after its objects were stored and one with its manifest written, not renamed, a set pull before it publishes and one in its directory swap,
#   and (last) a resume killed by its QEMU child, forked and not yet exec'd: restarted at once,
#   while that child holds copies of the daemon's socket and locks.
# After each restart: the operation is listed as failed with class interrupted and its result
# says what recovery did; it is the VM's last_operation (kept across the restart); the VM is
# running, paused or suspended (vm ls --json) and the next suspend and resume need no --force;
# every set in the store pulls whole; no temporaries, no push marks, no unfinished uploads, no
# objects a manifest does not name. Then SIGTERM during a suspend to a store that never answers
# its upload: the suspend is cancelled, the VM keeps its checkpoint (paused), the journal is
# empty, and the guest's RAM blob still has its md5.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/integration/vm_lib.sh"
. "$VMSNAP_SRC/tests/integration/daemon_lib.sh"
R=$T/root
S=$R/state
ST=$R/store
mkdir -p "$R" "$ST"
from_golden "$S"
# shellcheck disable=SC2153
G=$GUEST

# a store that answers a push's marks and holds every other request (the SIGTERM case: the
# suspend's test of the store passes, the guest stops, the upload hangs)
python3 "$VMSNAP_SRC/tests/servers/marks_only.py" "$T/silent.port" &
SILENT=$!
at_exit "kill $SILENT"
wait_for 5 test -s "$T/silent.port" || fail "the silent store did not start"
daemon_profile hangkeys AKIDHANG notasecret

ARGS=(--set "root=$R" --set "asset_dir=$G" --set "state_dir=$S" --set "ram_dir=$VMSNAP_RAM_DIR"
    --set "cache_dir=$R/cache" --set workers=1 --set stop_timeout=1
    --set "profile=hang aws=hangkeys endpoint=http://127.0.0.1:$(cat "$T/silent.port") region=us-east-1 path_style")
daemon_start "${ARGS[@]}" || done_tests

# killed_at FAILPOINT METHOD PATH BODY: the daemon restarted with the failpoint, the operation
# submitted, the daemon dead of it (SIGKILL), restarted without; the operation's id in $KID
KID=
killed_at() {
    local fp=$1 rc=0
    shift
    daemon_stop || fail "vmsnapd did not stop cleanly before $fp"
    DAEMON_ENV=("VMSNAP_FAILPOINT=$fp")
    daemon_restart || return 1
    KID=
    # (the answer may be lost when the daemon dies before it is sent: the id is then the one
    # operation the restarted daemon recovered)
    [ "$(dapi "$@")" = 202 ] && KID=$(dj 'j["operation"]["id"]')
    wait "$DPID" || rc=$?
    DPID=
    DAEMON_ENV=()
    [ "$rc" = 137 ] || { fail "$fp: the daemon was not killed there (exit $rc)"; return 1; }
    daemon_restart || return 1
    [ -n "$KID" ] || { dapi GET /v1/operations >/dev/null && KID=$(dj '" ".join(o["id"] for o in j["operations"])'); }
}

# recovered WHAT: the killed operation is listed, failed with class interrupted, and says what
# recovery did; recovery was complete
recovered() {
    local st
    st=$(dapi GET /v1/operations)
    [ "$st" = 200 ] || { fail "$1: GET /v1/operations: $st"; return 1; }
    dschema OperationList
    [ "$(dj "(lambda o: len(o) == 1 and o[0]['state'] == 'failed' and \
o[0]['error']['class'] == 'interrupted' and o[0]['result']['recovery']['ok'] is True and \
len(o[0]['result']['recovery']['actions']) > 0)([x for x in j['operations'] if x['id'] == '$KID'])")" = True ] ||
        fail "$1: the killed operation $KID as listed: $(cat "$T/resp")"
    grep -q "\"operation $KID .*recovery: " "$DLOG" || fail "$1: no recovery line in the log"
}

# vm_settled WHAT STATUS...: the VM's status (vm ls --json) is one of STATUS, its last operation
# the killed one (the restarted daemon knows it)
vm_settled() {
    local what=$1 s
    shift
    s=$(vmc "$S" ls --json | jget /dev/stdin '[v["status"] for v in j["vms"] if v["name"] == "golden"][0]')
    case " $* " in *" $s "*) ;; *) fail "$what: the VM is '$s', not one of: $*" ;; esac
    [ "$(dapi GET /v1/vms/golden)" = 200 ] || fail "$what: GET /v1/vms/golden: $(cat "$T/resp")"
    [ "$(dj "j['vm']['last_operation']['id'] == '$KID' and j['vm']['operation'] is None")" = True ] ||
        fail "$what: the VM's last operation is not the killed one: $(cat "$T/resp")"
    [ -z "$(ls "$S/vmsnapd"/*/ops/)" ] || fail "$what: journal entries left: $(ls "$S/vmsnapd"/*/ops/)"
    VMS=$s
}

# no_leftovers WHAT [objects]: no temporaries in the VM's directories, the RAM directory and the
# store; no push marks or unfinished uploads; with "objects" (after a push's recovery, whose gc
# takes all of them) no objects no manifest names
no_leftovers() {
    local junk
    junk=$(find "$S/vms/golden" "$VMSNAP_RAM_DIR" "$ST" "$R/pulled" -regextype posix-extended \
        \( -regex '.*/\.[^/]*\.[A-Za-z0-9]{6}' -o -name '*.discard' -o -name 'checkpoint.new' \
        -o -name 'checkpoint.old' -o -name '.vmsnap-pull.*' -o -name '.vmsnap-old.*' \
        -o -name '*.vmsnap-swap.*' -o -name 'vmsnap-push-*.json' -o -name '*.mpu-*' \) 2>/dev/null || true)
    [ -z "$junk" ] || fail "$1: left: $junk"
    [ "${2:-}" = objects ] || return 0
    junk=$(python3 - "$ST" <<'EOF'
import json, os, sys
root = sys.argv[1]
need, have = set(), set()
for d, _, fs in os.walk(root):
    for n in fs:
        p = os.path.join(d, n)
        have.add(p.lstrip("/"))
        if n == "manifest.json":
            m = json.load(open(p))
            need.add(p.lstrip("/"))
            for f in m.get("files", {}).values():
                for l in f.get("layers", []):
                    need.add(l["key"])
                    if "pages" in l:
                        need.add(l["pages"]["key"])
print(" ".join(sorted(k for k in have - need if "/vmsnap-objects/" in "/" + k)))
EOF
)
    [ -z "$junk" ] || fail "$1: objects no manifest names: $junk"
}

# set_whole URL: the set pulls (every object verified against its manifest)
set_whole() {
    rm -rf "$T/check"
    "$VMSNAP" -q pull "$1" "$T/check" 2>"$T/pull.err" || fail "the set $1 does not pull: $(cat "$T/pull.err")"
}

md5_ok() {
    [ "$(blob_md5 "$S" golden)" = "$boot_md5" ] || fail "$1: the guest's RAM blob md5 changed"
}

# 1. a resume killed after QEMU restored the guest: frozen; recovery lets it run
killed_at resume-restored POST /v1/vms/golden/resume '{}' || done_tests
recovered "resume killed after the restore"
vm_settled "resume killed after the restore" running
no_leftovers "resume killed after the restore"
md5_ok "resume killed after the restore"

# 2. a suspend killed once its stage is taken (the stage the only copy): recovery resumes it
killed_at suspend-staged POST /v1/vms/golden/suspend "{\"url\":\"$ST/s1\"}" || done_tests
recovered "suspend killed with its stage taken"
vm_settled "suspend killed with its stage taken" running
no_leftovers "suspend killed with its stage taken" objects

# 3. a suspend killed once every object is stored, not its manifest: the mark and the objects
# go (gc by the daemon), the VM runs on from its stage
killed_at layered-uploaded POST /v1/vms/golden/suspend "{\"url\":\"$ST/s1\"}" || done_tests
recovered "suspend killed before its commit"
vm_settled "suspend killed before its commit" running
no_leftovers "suspend killed before its commit" objects
[ -e "$ST/s1/manifest.json" ] && fail "a suspend killed before its commit left a manifest"
dop POST /v1/vms/golden/suspend "{\"url\":\"$ST/s1\"}" || done_tests
set_whole "$ST/s1"
dop POST /v1/vms/golden/resume "{\"url\":\"$ST/s1\"}" || done_tests
md5_ok "suspend and resume after two killed suspends"

# 4. a suspend over that set killed after its commit, before the record says so
killed_at push-committed POST /v1/vms/golden/suspend "{\"url\":\"$ST/s1\"}" || done_tests
recovered "suspend killed after its commit"
vm_settled "suspend killed after its commit" running suspended
no_leftovers "suspend killed after its commit" objects
set_whole "$ST/s1"
[ "$VMS" = suspended ] || dop POST /v1/vms/golden/suspend "{\"url\":\"$ST/s1\"}" || done_tests

# 5. a resume from the store killed before QEMU starts
killed_at resume-before-restore POST /v1/vms/golden/resume "{\"url\":\"$ST/s1\"}" || done_tests
recovered "resume from the store killed before QEMU"
vm_settled "resume from the store killed before QEMU" running suspended
no_leftovers "resume from the store killed before QEMU"
[ "$VMS" = running ] || dop POST /v1/vms/golden/resume "{\"url\":\"$ST/s1\"}" || done_tests
md5_ok "resume from the store after a killed one"

# 6. a suspend killed in its teardown: suspended, its local state swept
killed_at suspend-teardown POST /v1/vms/golden/suspend "{\"url\":\"$ST/s1\"}" || done_tests
recovered "suspend killed in its teardown"
vm_settled "suspend killed in its teardown" suspended running
no_leftovers "suspend killed in its teardown" objects
set_whole "$ST/s1"
[ "$VMS" = running ] || dop POST /v1/vms/golden/resume "{\"url\":\"$ST/s1\"}" || done_tests
md5_ok "resume after a suspend killed in its teardown"

# 7. a set push over a set, killed with its objects stored: the old set stays, whole, and the
# new one's objects and mark go
mkdir -p "$R/setA" "$R/setB"
mk "$R/setA/a" 3000000
mk "$R/setA/b" 70000
mk "$R/setB/a" 2000000
mk "$R/setB/c" 90000
dop POST /v1/sets/push "{\"path\":\"$R/setA\",\"url\":\"$ST/p1\"}" || done_tests
killed_at layered-uploaded POST /v1/sets/push "{\"path\":\"$R/setB\",\"url\":\"$ST/p1\"}" || done_tests
recovered "set push killed before its commit"
no_leftovers "set push killed before its commit" objects
set_whole "$ST/p1"
cmp -s "$T/check/a" "$R/setA/a" && cmp -s "$T/check/b" "$R/setA/b" ||
    fail "the old set is not what was pushed before the killed push"

# 7b. the same push killed with its manifest written under its temporary name, not yet renamed:
# the temporary goes too (no_leftovers), the old set stays
killed_at local-manifest-written POST /v1/sets/push "{\"path\":\"$R/setB\",\"url\":\"$ST/p1\"}" || done_tests
recovered "set push killed before its manifest's rename"
no_leftovers "set push killed before its manifest's rename" objects
set_whole "$ST/p1"
cmp -s "$T/check/a" "$R/setA/a" && cmp -s "$T/check/b" "$R/setA/b" ||
    fail "the old set is not what was pushed before the push killed before its manifest's rename"

# 8. a set pull over a pulled set, killed before it publishes and in its directory swap
dop POST /v1/sets/pull "{\"url\":\"$ST/p1\",\"path\":\"$R/pulled\"}" || done_tests
dop POST /v1/sets/push "{\"path\":\"$R/setB\",\"url\":\"$ST/p2\"}" || done_tests
for fp in pull-publishing dir-swap-exchange dir-swap-exchanged; do
    killed_at "$fp" POST /v1/sets/pull "{\"url\":\"$ST/p2\",\"path\":\"$R/pulled\"}" || done_tests
    recovered "set pull killed at $fp"
    no_leftovers "set pull killed at $fp"
    if cmp -s "$R/pulled/a" "$R/setA/a"; then
        cmp -s "$R/pulled/b" "$R/setA/b" || fail "pull killed at $fp: a mix of the two sets"
    else
        cmp -s "$R/pulled/a" "$R/setB/a" && cmp -s "$R/pulled/c" "$R/setB/c" ||
            fail "pull killed at $fp: neither the old set nor the new one"
    fi
done

# the journal is bounded: no entries once nothing runs; last operations only of VMs there are;
# the VM's last operation the same after a clean restart
[ "$(dapi GET /v1/vms/golden)" = 200 ] || fail "GET /v1/vms/golden: $(cat "$T/resp")"
dj 'json.dumps(j["vm"]["last_operation"], sort_keys=True)' >"$T/last.before"
daemon_stop || fail "vmsnapd did not stop cleanly"
n=$(find "$S/vmsnapd" -path '*/ops/*' | wc -l)
[ "$n" = 0 ] || fail "$n journal entries after a clean stop"
last=$(find "$S/vmsnapd" -path '*/last/*' -printf '%f ')
[ "$last" = "golden.json " ] || fail "last operations kept: $last"
daemon_restart || done_tests
[ "$(dapi GET /v1/vms/golden)" = 200 ] &&
    [ "$(dj 'json.dumps(j["vm"]["last_operation"], sort_keys=True)')" = "$(cat "$T/last.before")" ] &&
    [ "$(dj 'j["vm"]["last_operation"]["state"] != None')" = True ] ||
    fail "the last operation after a clean restart: $(cat "$T/resp") (before: $(cat "$T/last.before"))"

# 9. SIGTERM during a suspend to a store that never answers: cancelled after stop_timeout, the
# checkpoint kept (paused), nothing torn, the journal empty; resumed, the blob is intact
id=$(dsubmit POST /v1/vms/golden/suspend '{"url":"s3://bkt/never","profile":"hang"}') || done_tests
snapshotted() {
    [ "$(dapi GET "/v1/operations/$id")" = 200 ] && [ "$(dj 'j["operation"]["state"]')" = running ] &&
        [ -n "$(vmc "$S" ls --json | jget /dev/stdin '[v for v in j["vms"] if v["name"] == "golden" and v["status"] == "busy"]')" ] &&
        ! pgrep -f "$S/vms/golden/qmp.sock" >/dev/null
}
wait_for 120 snapshotted || fail "the suspend to the silent store did not stop the guest"
daemon_stop TERM || fail "vmsnapd did not stop cleanly on SIGTERM during a suspend"
grep -q "\"operation $id vm.suspend vm:golden: cancelled" "$DLOG" ||
    fail "the suspend was not cancelled by the stop: $(tail -n 5 "$DLOG")"
s=$(vmc "$S" ls --json | jget /dev/stdin '[v["status"] + " " + str(v["checkpoint"]) for v in j["vms"] if v["name"] == "golden"][0]')
[ "$s" = "paused True" ] || fail "after SIGTERM during a suspend the VM is '$s', not paused with its checkpoint"
[ -z "$(find "$S/vmsnapd" -path '*/ops/*')" ] || fail "journal entries after SIGTERM"
KID=$id
daemon_restart || done_tests
vm_settled "after SIGTERM during a suspend" paused
no_leftovers "after SIGTERM during a suspend"
dop POST /v1/vms/golden/resume '{}' || done_tests
md5_ok "resume after SIGTERM during a suspend"
dop POST /v1/vms/golden/suspend "{\"url\":\"$ST/s1\"}" || done_tests
set_whole "$ST/s1"

# 10. a resume killed by its QEMU child, forked and not yet exec'd (it holds copies of the
# daemon's descriptors, the listening socket and the journal's lock among them, and sleeps
# with them): the restart at once is not refused as if the dead daemon were alive, and its
# recovery resumes the VM
killed_at qemu-forked POST /v1/vms/golden/resume "{\"url\":\"$ST/s1\"}" || done_tests
recovered "resume killed by its forked QEMU child"
vm_settled "resume killed by its forked QEMU child" running
no_leftovers "resume killed by its forked QEMU child"
md5_ok "resume after one killed by its forked QEMU child"
dop POST /v1/vms/golden/suspend "{\"url\":\"$ST/s1\"}" || done_tests
daemon_stop || fail "vmsnapd did not stop cleanly"
done_tests
