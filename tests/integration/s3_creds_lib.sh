# SPDX-License-Identifier: Apache-2.0
# Shared by the s3_creds_* tests: the RGW of the xfer_rgw fixture (its own keys kept aside), extra
# keys of its user made for a test and removed after, vmsnap run in a clean AWS environment, the
# loopback servers of tests/servers/ (credential endpoints, a logging relay / TLS terminator), and
# the final check that no secret reached any captured output.
command -v python3 >/dev/null || skip "python3 is not installed (it plays the metadata and STS endpoints)"
command -v radosgw-admin >/dev/null || skip "radosgw-admin is not installed (scripts/deps.sh s3)"
. "$VMSNAP_SRC/tests/integration/xfer_s3_lib.sh"
RGW_EP=$AWS_ENDPOINT_URL
RGW_AK=$AWS_ACCESS_KEY_ID
RGW_SK=$AWS_SECRET_ACCESS_KEY
SERVERS=$VMSNAP_SRC/tests/servers
L=$T/logs # every output a test captures goes here: checked for secrets at the end
mkdir -p "$L" "$T/home"
SECRETS=("$RGW_SK")

rgwadmin() { radosgw-admin -c "$VMSNAP_RGW_STATE/ceph.conf" "$@"; }

# mkkey VAR: a new S3 key pair of the RGW user "test" (the bucket's owner): ${VAR}_AK, ${VAR}_SK
KEYS_MADE=()
mkkey() {
    local ak sk
    ak=CK$$${1}$RANDOM
    sk=$(head -c 30 /dev/urandom | base64 | tr -d '/+=' | head -c 40)
    rgwadmin key create --uid=test --key-type=s3 --access-key="$ak" --secret-key="$sk" >/dev/null ||
        fail "radosgw-admin key create"
    KEYS_MADE+=("$ak")
    SECRETS+=("$sk")
    printf -v "${1}_AK" %s "$ak"
    printf -v "${1}_SK" %s "$sk"
}
rmkey() { rgwadmin key rm --uid=test --key-type=s3 --access-key="$1" >/dev/null; }
rm_keys() {
    local k
    for k in ${KEYS_MADE[@]+"${KEYS_MADE[@]}"}; do rmkey "$k" 2>/dev/null || true; done
}
at_exit rm_keys
# mktoken VAR: a random session token, counted as a secret
mktoken() {
    local t
    t=tok$(head -c 48 /dev/urandom | base64 | tr -d '/+=')
    SECRETS+=("$t")
    printf -v "$1" %s "$t"
}

# The environment vmsnap (and aws) runs in: nothing of the caller's AWS or Google settings, a
# home of its own (no ~/.aws or ~/.config/gcloud but the test's), instance metadata and the GCE
# metadata server off unless a test turns them on.
CLEAN=(-u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY -u AWS_SESSION_TOKEN -u AWS_ENDPOINT_URL
    -u AWS_ENDPOINT_URL_S3 -u AWS_ENDPOINT_URL_STS -u AWS_REGION -u AWS_DEFAULT_REGION -u AWS_PROFILE
    -u AWS_DEFAULT_PROFILE -u AWS_CONFIG_FILE -u AWS_SHARED_CREDENTIALS_FILE -u AWS_CA_BUNDLE
    -u AWS_WEB_IDENTITY_TOKEN_FILE -u AWS_ROLE_ARN -u AWS_ROLE_SESSION_NAME
    -u AWS_CONTAINER_CREDENTIALS_RELATIVE_URI -u AWS_CONTAINER_CREDENTIALS_FULL_URI
    -u AWS_CONTAINER_AUTHORIZATION_TOKEN -u AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE
    -u AWS_EC2_METADATA_SERVICE_ENDPOINT -u SSL_CERT_FILE -u SSL_CERT_DIR -u CURL_CA_BUNDLE
    -u AWS_MAX_ATTEMPTS -u AWS_S3_USE_PATH_STYLE -u VMSNAP_S3_ATTEMPTS -u GS_ACCESS_KEY_ID
    -u GS_SECRET_ACCESS_KEY -u GOOGLE_APPLICATION_CREDENTIALS -u CLOUDSDK_CONFIG -u GCE_METADATA_HOST
    -u GCE_METADATA_TIMEOUT -u VMSNAP_GS_ENDPOINT HOME="$T/home" AWS_EC2_METADATA_DISABLED=true
    NO_GCE_CHECK=true)
# vrun NAME [VAR=VALUE...] -- ARGS...: vmsnap ARGS in the clean environment plus the VARs;
# stdout and stderr in $L/NAME.out and $L/NAME.err; its exit status is vrun's.
vrun() {
    local name=$1 vars=()
    shift
    while [ "$1" != -- ]; do vars+=("$1"); shift; done
    shift
    env "${CLEAN[@]}" ${vars[@]+"${vars[@]}"} "$VMSNAP" "$@" >"$L/$name.out" 2>"$L/$name.err"
}
# vok NAME ...: vrun that must succeed; vno NAME ...: must fail with a failure's exit code (1,
# or 3-7 by its class: docs/cli.md) and a message
vok() { vrun "$@" || fail "$1: exit $? ($(tail -c 400 "$L/$1.err"))"; }
vno() {
    local rc=0
    vrun "$@" || rc=$?
    case $rc in 1 | [3-7]) ;; *) fail "$1: exit $rc, expected a failure's 1 or 3-7 ($(tail -c 300 "$L/$1.err"))" ;; esac
    [ -s "$L/$1.err" ] || fail "$1: no error message"
}
# has NAME TEXT: the error of run NAME says TEXT
has() { grep -qF -- "$2" "$L/$1.err" || fail "$1: the message lacks '$2': $(tail -c 400 "$L/$1.err")"; }

# start_server VAR SCRIPT ARGS...: a python3 server of tests/servers/ on an ephemeral port;
# its port in $VAR, killed at exit
SERVER_PIDS=()
start_server() {
    local var=$1 script=$2 pf
    shift 2
    pf=$T/port.$var
    rm -f "$pf"
    python3 "$SERVERS/$script" --port-file "$pf" "$@" 2>>"$L/server-$var.err" &
    SERVER_PIDS+=($!)
    wait_for 10 test -s "$pf" || fail "$script did not start: $(cat "$L/server-$var.err")"
    printf -v "$var" %s "$(cat "$pf")"
}
stop_servers() {
    local p
    for p in ${SERVER_PIDS[@]+"${SERVER_PIDS[@]}"}; do kill "$p" 2>/dev/null || true; done
    for p in ${SERVER_PIDS[@]+"${SERVER_PIDS[@]}"}; do wait "$p" 2>/dev/null || true; done
}
at_exit stop_servers

# creds_file FILE AK SK TOKEN TTL: what aws_meta.py hands out (re-read at each request)
creds_file() {
    printf '{"access_key":"%s","secret_key":"%s","token":"%s","ttl":%s}\n' "$2" "$3" "$4" "$5" \
        >"$1.tmp" && mv "$1.tmp" "$1"
}
issued() {
    local n
    n=$(grep -c ' issued' "$1" 2>/dev/null) || true
    echo "${n:-0}"
}

# a small snapshot set to push and pull
mkdir -p "$T/set"
head -c 300000 /dev/urandom >"$T/set/memory"
echo '{"vcpus":1}' >"$T/set/state.json"
same_set() { diff -r "$T/set" "$1" >/dev/null; }

# no_secrets: no key secret or token made or used by the test appears in any captured output
# (vmsnap's and aws's stdout and stderr, the servers' logs)
no_secrets() {
    local s
    for s in "${SECRETS[@]}"; do
        if grep -rqF -- "$s" "$L"; then
            fail "a secret appears in $(grep -rlF -- "$s" "$L" | tr '\n' ' ')"
        fi
    done
}
