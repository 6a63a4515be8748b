#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Faults between vmsnap and RGW through tests/faultproxy.c: 503s, resets and delays on chosen
# requests are retried and the result is byte-identical; a server that goes away mid-push or
# mid-pull gives an error after bounded retries with no object, upload or file left behind.
. "$VMSNAP_SRC/tests/lib.sh"
. "$VMSNAP_SRC/tests/integration/xfer_s3_lib.sh"
FP=${VMSNAP_FAULTPROXY:?}
M=$((1024 * 1024))
PROXY_PID=
start_proxy() { # RULES
    stop_proxy
    rm -f "$T/port"
    "$FP" "$T/port" "$VMSNAP_RGW_PORT" "$1" 2>>"$T/proxy.log" &
    PROXY_PID=$!
    for _ in $(seq 1 100); do [ -s "$T/port" ] && break; sleep 0.05; done
    [ -s "$T/port" ] || fail "fault proxy did not start"
    PEP=http://127.0.0.1:$(cat "$T/port")
}
stop_proxy() {
    if [ -n "$PROXY_PID" ]; then kill "$PROXY_PID" 2>/dev/null; wait "$PROXY_PID" 2>/dev/null || true; fi
    PROXY_PID=
}
trap 'stop_proxy; t_cleanup' EXIT
export VMSNAP_S3_STALL_SECONDS=1 # a 1.5 s stall counts as a timeout and is retried

head -c $((17 * M)) /dev/urandom >"$T/r"
"$VMSNAP" -q pack "$T/r" "$T/r.pk"

# push through 503 / reset / stall on chosen requests (m = counting upload-part requests only)
start_proxy "2:503,m1:503,m2:reset,m3:delay1500,m4:503"
"$VMSNAP" -v push -j 4 --part-size 5M --endpoint "$PEP" "$T/r" "s3://$BUCKET/f" 2>"$T/log" ||
    fail "push through faults: $(tail -3 "$T/log")"
grep -q "retry" "$T/log" || fail "no retries were logged: the faults did not hit"
raw_get f "$T/raw"
cmp -s "$T/raw" "$T/r.pk" || fail "object pushed through faults differs"
[ "$(uploads_left)" = 0 ] || fail "uploads left after a successful push"

# pull through faults
start_proxy "1:503,3:reset,5:503,6:delay1500"
"$VMSNAP" -v pull -j 4 --endpoint "$PEP" "s3://$BUCKET/f" "$T/out" 2>"$T/log" ||
    fail "pull through faults: $(tail -3 "$T/log")"
grep -q "retry" "$T/log" || fail "pull: no retries were logged"
cmp -s "$T/out" "$T/r" || fail "pull through faults differs"

# the server goes away mid-push: every part request from the 2nd on is reset
start_proxy "m2+:reset"
VMSNAP_S3_ATTEMPTS=3 expect_fail "push with the server gone" \
    "$VMSNAP" push -j 2 --part-size 5M --endpoint "$PEP" "$T/r" "s3://$BUCKET/gone"
grep -q "gave up after 3 attempts" "$T/err" || fail "push: not a bounded-retry error: $(cat "$T/err")"
[ "$(head_code gone)" = 404 ] || fail "an object is visible after the failed push"
[ "$(uploads_left)" = 0 ] || fail "the failed push left its multipart upload"

# ... and mid-pull: from the 4th request on
start_proxy "4+:reset"
VMSNAP_S3_ATTEMPTS=3 expect_fail "pull with the server gone" \
    "$VMSNAP" pull -j 2 --endpoint "$PEP" "s3://$BUCKET/f" "$T/gone"
grep -q "gave up after 3 attempts" "$T/err" || fail "pull: not a bounded-retry error: $(cat "$T/err")"
[ -e "$T/gone" ] && fail "a file was left at the destination"
ls -A "$T" | grep -q '^\.gone' && fail "a temporary file was left"
stop_proxy
OUT=/dev/null s3curl DELETE "$BUCKET/f" >/dev/null
done_tests
