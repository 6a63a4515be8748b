#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Temporary credentials refreshed during a long push, against the real RGW. Instance metadata
# (tests/servers/aws_meta.py, IMDSv2) hands out key A of the RGW user with an Expiration TTL
# seconds ahead; once it has, the server switches to key B. After A's Expiration has passed, A is
# revoked in RGW (radosgw-admin key rm). The push, slowed by the fault proxy (every part delayed)
# so that it lasts well past that expiry by construction, succeeds only if it refreshed its
# credentials before A expired and signed the rest with B: the provider must have been asked at
# least twice, and a pull round-trips the bytes. Four connections sign at once, so the refresh
# happens while other threads hold and use the old keys. The control first: a push whose
# credentials are not due for refresh fails once its key is revoked mid-push (the revocation
# does bite).
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/lib.sh"
. "$VMSNAP_SRC/tests/integration/s3_creds_lib.sh"

# A's lifetime TTL; refreshed REFRESH s before its end (VMSNAP_CREDS_REFRESH_SECONDS), which
# leaves a request signed with A just before the refresh REFRESH - DELAY s to reach RGW before A
# is revoked. J connections refresh and sign concurrently; each part is held DELAY ms by the
# proxy, so the push takes at least PARTS / J * DELAY = 32 s, well past A's expiry.
TTL=20
REFRESH=10
J=4
PARTS=32
DELAY=4000
M=$((1024 * 1024))
head -c $((PARTS * 5 * M)) /dev/urandom >"$T/big"
mkkey RA
mkkey RB
mkkey RC
mktoken TA
mktoken TB
mktoken TC
creds_file "$T/creds.json" "$RC_AK" "$RC_SK" "$TC" 3600
start_server IMDS aws_meta.py imds --creds "$T/creds.json" --log "$L/imds.log"
start_proxy "m1+:delay$DELAY"
ENVS=(AWS_EC2_METADATA_DISABLED=false AWS_EC2_METADATA_SERVICE_ENDPOINT="http://127.0.0.1:$IMDS"
    AWS_METADATA_SERVICE_TIMEOUT=5 VMSNAP_CREDS_REFRESH_SECONDS=$REFRESH VMSNAP_S3_ATTEMPTS=2
    AWS_ENDPOINT_URL="$RGW_EP")
U=s3://$BUCKET
PUSH_PID=
stop_push() { [ -z "$PUSH_PID" ] || kill "$PUSH_PID" 2>/dev/null || true; }
at_exit stop_push
# bgpush NAME KEY: the slow push in the background ($PUSH_PID)
bgpush() {
    env "${CLEAN[@]}" "${ENVS[@]}" "$VMSNAP" -v push -j "$J" --part-size 5M --endpoint "$PEP" \
        "$T/big" "$U/$2" >"$L/$1.out" 2>"$L/$1.err" &
    PUSH_PID=$!
}
issued_ge() { [ "$(issued "$L/imds.log")" -ge "$1" ]; }
# a request signed with key $1 is refused by RGW (its revocation took effect)
refused() {
    [ "$(curl -s -o /dev/null -w '%{http_code}' --aws-sigv4 "aws:amz:us-east-1:s3" --user "$1:$2" \
        -H "x-amz-content-sha256: $EMPTY_SHA" "$RGW_EP/$BUCKET")" = 403 ]
}

# ---- control: credentials valid for an hour (not due), their key revoked mid-push: it fails
bgpush control ctl
wait_for 60 issued_ge 1 || fail "control: instance metadata was never asked"
rmkey "$RC_AK"
wait_for 30 refused "$RC_AK" "$RC_SK" || fail "control: RGW still takes the revoked key C"
rc=0
wait "$PUSH_PID" || rc=$?
PUSH_PID=
[ "$rc" = 4 ] || fail "control: a push whose key was revoked mid-way exited $rc, not 4 (access denied)"
grep -q "access denied" "$L/control.err" || fail "control: $(tail -c 300 "$L/control.err")"

# ---- the refresh: A for TTL seconds, then B; A revoked after its expiry, mid-push
: >"$L/imds.log"
creds_file "$T/creds.json" "$RA_AK" "$RA_SK" "$TA" "$TTL"
bgpush push refresh
wait_for 60 issued_ge 1 || fail "instance metadata was never asked"
t_first=$(date +%s) # A was handed out before now: it expires at most TTL s from here
creds_file "$T/creds.json" "$RB_AK" "$RB_SK" "$TB" 3600
wait_for 60 issued_ge 2 || fail "no refresh: instance metadata was asked $(issued "$L/imds.log") time(s)"
while [ "$(date +%s)" -le $((t_first + TTL + 1)) ]; do sleep 0.2; done
kill -0 "$PUSH_PID" 2>/dev/null ||
    fail "the push ended before key A expired: it cannot show the refresh (slower parts needed)"
rmkey "$RA_AK"
wait_for 30 refused "$RA_AK" "$RA_SK" || fail "RGW still takes the revoked key A"
rc=0
wait "$PUSH_PID" || rc=$?
PUSH_PID=
[ "$rc" = 0 ] || fail "the push across the refresh failed (exit $rc): $(tail -c 400 "$L/push.err")"
grep -q "credentials refreshed from the instance metadata" "$L/push.err" ||
    fail "the push does not say it refreshed: $(grep 'credentials' "$L/push.err")"
[ "$(issued "$L/imds.log")" -ge 2 ] || fail "credentials handed out $(issued "$L/imds.log") times, not >= 2"
vok pull "${ENVS[@]}" -- -q pull "$U/refresh" "$T/big.out"
cmp -s "$T/big" "$T/big.out" || fail "the pushed object does not round-trip"

no_secrets
done_tests
