#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Snapshot sets through vmsnapd against the real RGW (the xfer_rgw fixture): push, ls, pull
# (the files come back byte for byte), a second push over the first as its base, gc (a dry run
# that changes nothing, then one that aborts a stale upload and leaves the sets alone), rm. The
# keys come only from a profile configured on the node: the daemon's environment has none, so
# the same requests without a profile are refused by the store, a profile the node does not
# know is refused at the door (403), and the secret is in no answer and no log line.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/lib.sh"
. "$VMSNAP_SRC/tests/integration/xfer_s3_lib.sh"
. "$VMSNAP_SRC/tests/integration/daemon_lib.sh"
R=$T/root
mkdir -p "$R/set"
M=$((1 << 20))
head -c $((3 * M)) /dev/urandom >"$R/set/memory-ranges"
truncate -s $((40 * M)) "$R/set/memory-ranges"
head -c $M /dev/urandom | dd of="$R/set/memory-ranges" bs=1M seek=32 conv=notrunc status=none
echo '{"state": 1}' >"$R/set/state.json"

daemon_profile rgwkeys "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY"
DAEMON_ENV=("AWS_ENDPOINT_URL=$AWS_ENDPOINT_URL")
daemon_start --set "root=$R" --set "cache_dir=$R/cache" \
    --set "profile=rgw aws=rgwkeys endpoint=$AWS_ENDPOINT_URL region=us-east-1 path_style" ||
    done_tests
U=s3://$BUCKET/sets

dop POST /v1/sets/push "{\"path\":\"$R/set\",\"url\":\"$U/a\",\"profile\":\"rgw\"}" || done_tests
[ "$(opj "j['result']['files'] == 2 and j['result']['logical_bytes'] == $((40 * M)) + \
$(stat -c %s "$R/set/state.json") and 0 < j['result']['object_bytes'] < $((40 * M))")" = True ] ||
    fail "push a: $(cat "$T/op.json")"
[ "$(head_code sets/a/manifest.json)" = 200 ] || fail "no manifest of set a in the bucket"

# b: the same set with a changed page, pushed over a as its base
head -c 4096 /dev/urandom | dd of="$R/set/memory-ranges" bs=4096 seek=5 conv=notrunc status=none
dop POST /v1/sets/push "{\"path\":\"$R/set\",\"url\":\"$U/b\",\"base\":\"$U/a\",\"profile\":\"rgw\"}" ||
    done_tests
[ "$(head_code sets/b/manifest.json)" = 200 ] || fail "no manifest of set b in the bucket"

st=$(dapi GET "/v1/sets?url=$U/&profile=rgw")
[ "$st" = 200 ] || fail "ls: $st $(cat "$T/resp")"
dschema SetList
[ "$(dj "sorted(s['url'] for s in j['sets'] if s['valid'] and s['files'] == 2) == ['$U/a', '$U/b']")" = True ] ||
    fail "ls does not list sets a and b: $(cat "$T/resp")"

for s in a b; do
    dop POST /v1/sets/pull "{\"url\":\"$U/$s\",\"path\":\"$R/out-$s\",\"profile\":\"rgw\"}" || continue
    [ "$(opj 'j["result"]["files"]')" = 2 ] || fail "pull $s: $(cat "$T/op.json")"
done
cmp "$R/set/memory-ranges" "$R/out-b/memory-ranges" || fail "pulled set b's memory differs"
cmp "$R/set/state.json" "$R/out-b/state.json" || fail "pulled set b's state differs"
cmp -s "$R/set/memory-ranges" "$R/out-a/memory-ranges" && fail "set a holds b's changed page"
cmp -n $((5 * 4096)) "$R/set/memory-ranges" "$R/out-a/memory-ranges" ||
    fail "pulled set a differs before the changed page"

# gc: a stale upload under the prefix (started by curl's own signer); a dry run leaves it, a gc
# with older_than_seconds 0 aborts it and keeps both sets
[ "$(s3curl POST "$BUCKET/sets/g/x.zstd?uploads=")" = 200 ] || fail "start an upload under sets/g/"
dop POST /v1/sets/gc "{\"url\":\"$U\",\"older_than_seconds\":0,\"dry_run\":true,\"profile\":\"rgw\"}"
[ "$(opj 'j["result"]["aborted_uploads"] == 1 and j["result"]["dry_run"]')" = True ] ||
    fail "gc dry run: $(cat "$T/op.json")"
[ "$(uploads_left)" = 1 ] || fail "a dry-run gc aborted the upload"
dop POST /v1/sets/gc "{\"url\":\"$U\",\"older_than_seconds\":0,\"profile\":\"rgw\"}"
[ "$(opj 'j["result"]["aborted_uploads"]')" = 1 ] || fail "gc: $(cat "$T/op.json")"
[ "$(uploads_left)" = 0 ] || fail "gc left the stale upload"
[ "$(head_code sets/a/manifest.json) $(head_code sets/b/manifest.json)" = "200 200" ] ||
    fail "gc touched a committed set"

# rm a: gone from the bucket and from ls (the layered layout keeps the objects b shares with it
# for gc); b, pushed over a, still pulls whole
dop POST /v1/sets/remove "{\"url\":\"$U/a\",\"profile\":\"rgw\"}" || done_tests
[ "$(opj 'j["result"]["removed"]')" = set ] || fail "rm a: $(cat "$T/op.json")"
[ "$(head_code sets/a/manifest.json)" = 404 ] || fail "set a's manifest is still in the bucket"
dapi GET "/v1/sets?url=$U/&profile=rgw" >/dev/null
[ "$(dj "[s['url'] for s in j['sets']] == ['$U/b']")" = True ] || fail "ls after rm: $(cat "$T/resp")"
rm -rf "$R/out-b"
dop POST /v1/sets/pull "{\"url\":\"$U/b\",\"path\":\"$R/out-b\",\"profile\":\"rgw\"}" &&
    { cmp "$R/set/memory-ranges" "$R/out-b/memory-ranges" || fail "set b after rm of a differs"; }

# no profile: the daemon has no keys of its own and the store refuses; an unknown profile is
# refused before anything runs
id=$(dsubmit POST /v1/sets/push "{\"path\":\"$R/set\",\"url\":\"$U/c\"}") &&
    { dwait "$id" && fail "a push naming no profile succeeded"; }
[ "$(opj 'j["state"] + " " + j["error"]["class"]')" = "failed access_denied" ] ||
    fail "a push naming no profile: $(cat "$T/op.json")"
[ "$(head_code sets/c/manifest.json)" = 404 ] || fail "a push naming no profile stored a manifest"
st=$(dapi GET "/v1/sets?url=$U/")
[ "$st" = 403 ] && [ "$(dj 'j["error"]["class"]')" = access_denied ] ||
    fail "ls naming no profile: $st $(cat "$T/resp")"
st=$(dapi POST /v1/sets/push "{\"path\":\"$R/set\",\"url\":\"$U/c\",\"profile\":\"rgwkeys\"}")
[ "$st" = 403 ] && [ "$(dj 'j["error"]["class"]')" = access_denied ] ||
    fail "a profile the node does not configure (an AWS profile's name): $st $(cat "$T/resp")"
grep -q "$AWS_SECRET_ACCESS_KEY" "$DLOG" "$T/resp" "$T/op.json" && fail "the secret key is in the log or an answer"
daemon_stop || fail "vmsnapd did not stop cleanly"
done_tests
