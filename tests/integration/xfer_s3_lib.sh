# SPDX-License-Identifier: Apache-2.0
# Shared by the S3 tests: the RGW started by the xfer_rgw fixture, a fresh bucket, and raw
# object access through curl's own SigV4 signer (independent of vmsnap's).
[ -n "${VMSNAP_RGW_STATE:-}" ] && [ -f "$VMSNAP_RGW_STATE/env" ] ||
    skip "no RGW running (the xfer_rgw_up fixture did not start one; needs scripts/deps.sh s3)"
# shellcheck disable=SC1091
. "$VMSNAP_RGW_STATE/env"
BUCKET=vmsnap-t$$-$RANDOM
EMPTY_SHA=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855
s3curl() { # METHOD PATH [curl args...]: prints the HTTP status
    local m=$1 p=$2
    shift 2
    curl -sS -o "${OUT:-/dev/null}" -w '%{http_code}' --aws-sigv4 "aws:amz:us-east-1:s3" \
        --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" -H "x-amz-content-sha256: $EMPTY_SHA" \
        -X "$m" "$@" "$AWS_ENDPOINT_URL/$p"
}
raw_get() { OUT=$2 s3curl GET "$BUCKET/$1" >/dev/null; }
raw_put() { # KEY FILE: store FILE's bytes as KEY (through curl's signer); prints the HTTP status
    curl -sS -o /dev/null -w '%{http_code}' --aws-sigv4 "aws:amz:us-east-1:s3" \
        --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
        -H "x-amz-content-sha256: $(sha256sum "$2" | cut -d' ' -f1)" -T "$2" "$AWS_ENDPOINT_URL/$BUCKET/$1"
}
head_code() { s3curl HEAD "$BUCKET/$1" -I; }
keys_under() { # PREFIX: the keys of the bucket's objects under PREFIX, one per line
    OUT=$T/keys.xml s3curl GET "$BUCKET/?list-type=2&prefix=${1//\//%2F}" >/dev/null
    grep -o '<Key>[^<]*</Key>' "$T/keys.xml" | sed 's/<Key>\(.*\)<\/Key>/\1/'
}
uploads_left() { # count of unfinished multipart uploads in the bucket
    OUT=$T/uploads.xml s3curl GET "$BUCKET/?uploads=" >/dev/null
    grep -o '<UploadId>' "$T/uploads.xml" | wc -l
}
# start_proxy RULES: (re)start tests/faultproxy.c in front of the RGW with RULES; its address in
# $PEP, its log appended to $T/proxy.log. stop_proxy: stop it (a failure if it died meanwhile).
PROXY_PID=
start_proxy() {
    stop_proxy
    rm -f "$T/port"
    "${VMSNAP_FAULTPROXY:?}" "$T/port" "$VMSNAP_RGW_PORT" "$1" 2>>"$T/proxy.log" &
    PROXY_PID=$!
    wait_for 5 test -s "$T/port" || fail "fault proxy did not start"
    PEP=http://127.0.0.1:$(cat "$T/port")
}
stop_proxy() {
    if [ -n "$PROXY_PID" ]; then
        kill "$PROXY_PID" 2>/dev/null || fail "the fault proxy died"
        wait "$PROXY_PID" 2>/dev/null || true
    fi
    PROXY_PID=
}
at_exit stop_proxy
[ "$(s3curl PUT "$BUCKET")" = 200 ] || fail "cannot create bucket $BUCKET"
