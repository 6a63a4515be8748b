#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Store connections and credentials reused across the daemon's operations (store.h, "kept across
# stores"): vmsnapd pushes and pulls against the real RGW through a relay that counts the TCP
# connections it accepts (tests/servers/http_tap.py --conn-log), with its keys from instance
# metadata played on loopback (tests/servers/aws_meta.py, IMDSv2, real RGW keys with an
# expiry). Twelve operations make no more connections than were open at once (each operation
# opening its own, as before this, would connect at least twelve times) and ask instance metadata
# once; every set still pulls byte for byte. Credentials near their
# refresh are fetched anew, not reused. No secret in any output.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/lib.sh"
. "$VMSNAP_SRC/tests/integration/s3_creds_lib.sh"
. "$VMSNAP_SRC/tests/integration/daemon_lib.sh"

mkkey KI
mktoken TI
printf '%s\n' "$TI" >"$T/tokens"
creds_file "$T/ci.json" "$KI_AK" "$KI_SK" "$TI" 3600
start_server IMDS aws_meta.py imds --creds "$T/ci.json" --log "$L/imds.log"
: >"$L/conns.log"
start_server TAP http_tap.py --target "$VMSNAP_RGW_PORT" --log "$L/tap.log" --token-file "$T/tokens" \
    --conn-log "$L/conns.log"
conns() { wc -l <"$L/conns.log"; }

R=$T/root
mkdir -p "$R"
cp -r "$T/set" "$R/set"
# the node's profile names an AWS profile without keys: the chain goes on to instance metadata
printf '[nokeys]\nregion = us-east-1\n' >>"$DAWS_CREDS"
DAEMON_ENV=(AWS_EC2_METADATA_DISABLED=false "AWS_EC2_METADATA_SERVICE_ENDPOINT=http://127.0.0.1:$IMDS/"
    "HOME=$T/home")
daemon_start --set "root=$R" --set connections=8 --set op_connections=1 \
    --set "profile=md aws=nokeys endpoint=http://127.0.0.1:$TAP region=us-east-1 path_style" ||
    done_tests
U=s3://$BUCKET/reuse
metric() { curl -s --unix-socket "$DSOCK" http://localhost/metrics | sed -n "s/^$1 //p"; }

dop POST /v1/sets/push "{\"path\":\"$R/set\",\"url\":\"$U/a\",\"profile\":\"md\"}" || done_tests
c1=$(conns) i1=$(issued "$L/imds.log")
[ "$c1" -ge 1 ] || fail "the first push made no connection through the relay"
[ "$i1" = 1 ] || fail "instance metadata handed out credentials $i1 times for one push"
[ "$(metric vmsnapd_store_conns_idle)" -ge 1 ] || fail "no connection parked after the push"

# ten more operations: each opening its own connections (as before this) would make at least
# ten more; with the parked ones, all eleven together make no more than the most that were
# ever open at once, which the node's budget bounds (connections=8: at most 8 parked)
for i in 1 2 3 4 5; do
    echo "changed $i" >"$R/set/state.json"
    dop POST /v1/sets/push "{\"path\":\"$R/set\",\"url\":\"$U/b$i\",\"profile\":\"md\"}" || done_tests
    dop POST /v1/sets/pull "{\"url\":\"$U/a\",\"path\":\"$R/out-a$i\",\"profile\":\"md\"}" || done_tests
done
same_set "$R/out-a5" || fail "set a pulled through reused connections differs"
dop POST /v1/sets/pull "{\"url\":\"$U/b5\",\"path\":\"$R/out-b5\",\"profile\":\"md\"}" || done_tests
cmp "$R/set/state.json" "$R/out-b5/state.json" || fail "set b5 differs"
c2=$(conns) i2=$(issued "$L/imds.log")
[ "$c2" -le 8 ] || fail "twelve operations made $c2 connections (the first push $c1): not reused"
[ "$i2" = "$i1" ] || fail "credentials were fetched again ($((i2 - i1)) times) while the first set was valid"
[ "$(metric vmsnapd_store_conns_reused_total)" -ge 11 ] ||
    fail "the metrics count too few reused connections: $(metric vmsnapd_store_conns_reused_total)"
[ "$(metric vmsnapd_store_creds_reused_total)" = 11 ] ||
    fail "the metrics count $(metric vmsnapd_store_creds_reused_total) reused credential sets, not 11"
[ "$(metric vmsnapd_store_connects_total)" = "$c2" ] ||
    fail "the metrics count $(metric vmsnapd_store_connects_total) connections, the relay saw $c2"
n=$(wc -l <"$L/tap.log")
[ "$(sed -n 's/.* token=\([^ ]*\).*/\1/p' "$L/tap.log" | sort -u)" = ok ] ||
    fail "a request through the relay did not carry the handed-out token"

# credentials that live 4 s are due 2 s after they were fetched (half their life, below the
# 300 s window): a daemon started afresh fetches them for its first push, and a pull 3 s later
# fetches anew instead of taking the kept set
daemon_stop || fail "vmsnapd did not stop cleanly"
creds_file "$T/ci.json" "$KI_AK" "$KI_SK" "$TI" 4
daemon_restart || done_tests
dop POST /v1/sets/push "{\"path\":\"$R/set\",\"url\":\"$U/c\",\"profile\":\"md\"}" || done_tests
i3=$(issued "$L/imds.log")
[ "$i3" -gt "$i2" ] || fail "a restarted daemon fetched no credentials"
sleep 3
dop POST /v1/sets/pull "{\"url\":\"$U/c\",\"path\":\"$R/out-c\",\"profile\":\"md\"}" || done_tests
[ "$(issued "$L/imds.log")" -gt "$i3" ] || fail "credentials past half their life were reused"
cmp "$R/set/state.json" "$R/out-c/state.json" || fail "set c differs"

daemon_stop || fail "vmsnapd did not stop cleanly"
cp "$DLOG" "$L/vmsnapd.log"
no_secrets
done_tests
