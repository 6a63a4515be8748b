#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The credential providers end to end against the real RGW: instance metadata (IMDSv2, the
# session token required), the container endpoint (with its Authorization token, from the
# environment or a file), web identity (STS AssumeRoleWithWebIdentity with the token file, from
# the environment or a profile), each played by tests/servers/aws_meta.py on loopback handing out
# real RGW keys with a session token and an Expiration; the chain's order; the "no credentials"
# error naming each source; the User-Agent at every endpoint; no secret in any output.
#
# This RGW (rgw_s3_auth_use_sts = false, its default) ignores an x-amz-security-token it did not
# issue: a request signed with a user's real keys and any token is accepted (checked first
# below). So the servers hand out real keys plus a made-up token, and the relay in front of RGW
# (tests/servers/http_tap.py) checks that the token handed out is the one each request carries.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/lib.sh"
. "$VMSNAP_SRC/tests/integration/s3_creds_lib.sh"

VER=$("$VMSNAP" --version | cut -d' ' -f2)
mkkey KI # instance metadata's keys
mkkey KC # the container endpoint's
mkkey KW # STS's
mktoken TI
mktoken TC
mktoken TW
mktoken CTOK # the container endpoint's Authorization token
mktoken WIT  # the web identity token (a JWT for real; any string for our STS)
printf '%s\n%s\n%s\n' "$TI" "$TC" "$TW" >"$T/tokens"
start_server TAP http_tap.py --target "$VMSNAP_RGW_PORT" --log "$L/tap.log" --token-file "$T/tokens"
TEP=http://127.0.0.1:$TAP
U=s3://$BUCKET
touch "$L/tap.log"
tap_lines() { wc -l <"$L/tap.log"; }
# every request since line N of the tap log carried token $2 ("ok": one handed out; "none")
tokens_since() {
    local s
    s=$(tail -n +$(($1 + 1)) "$L/tap.log" | sed -n 's/.* token=\([^ ]*\).*/\1/p' | sort -u | tr '\n' ' ')
    [ "$s" = "$2 " ] || fail "$3: the requests carried token=$s, not $2"
}

# RGW and a token it did not issue: accepted (ignored), as said above
n=$(tap_lines)
vok rgw-token AWS_ACCESS_KEY_ID="$RGW_AK" AWS_SECRET_ACCESS_KEY="$RGW_SK" AWS_SESSION_TOKEN="$TI" -- \
    ls --endpoint "$TEP" "$U/"
tokens_since "$n" ok "AWS_SESSION_TOKEN"

# ---- instance metadata (IMDSv2)
creds_file "$T/ci.json" "$KI_AK" "$KI_SK" "$TI" 3600
start_server IMDS aws_meta.py imds --creds "$T/ci.json" --log "$L/imds.log"
IM=http://127.0.0.1:$IMDS
# the server plays IMDSv2 as it is: no token, 401; a token past its TTL, 401
[ "$(curl -s -o /dev/null -w '%{http_code}' "$IM/latest/meta-data/iam/security-credentials/")" = 401 ] ||
    fail "the IMDS server answered a GET without a token"
tk=$(curl -s -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 1' "$IM/latest/api/token")
sleep 2
[ "$(curl -s -o /dev/null -w '%{http_code}' -H "X-aws-ec2-metadata-token: $tk" \
    "$IM/latest/meta-data/iam/security-credentials/")" = 401 ] || fail "the IMDS server took an expired token"
: >"$L/imds.log"
IMDS_ENV=(AWS_EC2_METADATA_DISABLED=false "AWS_EC2_METADATA_SERVICE_ENDPOINT=$IM/" "AWS_ENDPOINT_URL=$TEP")
n=$(tap_lines)
vok imds-push "${IMDS_ENV[@]}" -- -q push "$T/set" "$U/imds"
vok imds-pull "${IMDS_ENV[@]}" -- -q pull "$U/imds" "$T/imds.out"
same_set "$T/imds.out" || fail "instance metadata: the pulled set differs"
tokens_since "$n" ok "instance metadata"
grep -q "^PUT /latest/api/token 200 ua=vmsnap/$VER$" "$L/imds.log" || fail "IMDS: no token PUT: $(cat "$L/imds.log")"
grep -q "^GET /latest/meta-data/iam/security-credentials/ 200" "$L/imds.log" || fail "IMDS: the role was not asked for"
[ "$(issued "$L/imds.log")" -ge 2 ] || fail "IMDS: credentials handed out $(issued "$L/imds.log") times for two runs"
grep -q " 401 " "$L/imds.log" && fail "vmsnap sent an IMDS request without a valid token"
grep -v "ua=vmsnap/$VER" "$L/imds.log" | grep -q . && fail "IMDS: a request without the User-Agent"

# ---- container endpoint: FULL_URI with the token from a file, or from the environment
creds_file "$T/cc.json" "$KC_AK" "$KC_SK" "$TC" 3600
printf '%s\n' "$CTOK" >"$T/ctok"
start_server CT aws_meta.py container --creds "$T/cc.json" --log "$L/ct.log" --path /v2/credentials/x1 \
    --auth-file "$T/ctok"
CT_ENV=("AWS_CONTAINER_CREDENTIALS_FULL_URI=http://127.0.0.1:$CT/v2/credentials/x1" "AWS_ENDPOINT_URL=$TEP")
n=$(tap_lines)
vok ct-file "${CT_ENV[@]}" AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE="$T/ctok" -- -q push "$T/set" "$U/ct"
vok ct-env "${CT_ENV[@]}" AWS_CONTAINER_AUTHORIZATION_TOKEN="$CTOK" -- -q pull "$U/ct" "$T/ct.out"
same_set "$T/ct.out" || fail "container: the pulled set differs"
tokens_since "$n" ok "container"
[ "$(issued "$L/ct.log")" = 2 ] || fail "container: credentials handed out $(issued "$L/ct.log") times, not 2"
vno ct-badauth "${CT_ENV[@]}" AWS_CONTAINER_AUTHORIZATION_TOKEN=wrong -- ls "$U/"
has ct-badauth "container credentials (http://127.0.0.1:$CT): HTTP 401"
vno ct-noauth "${CT_ENV[@]}" -- ls "$U/"
has ct-noauth "HTTP 401"
vno ct-remote AWS_CONTAINER_CREDENTIALS_FULL_URI=http://192.0.2.1/creds -- ls "$U/"
has ct-remote "plain http only to a loopback address"
grep -v "ua=vmsnap/$VER" "$L/ct.log" | grep -q . && fail "container: a request without the User-Agent"

# ---- web identity: STS with the token file, from the environment or a profile
creds_file "$T/cw.json" "$KW_AK" "$KW_SK" "$TW" 3600
printf '%s' "$WIT" >"$T/sts-expects"
printf '%s\n' "$WIT" >"$T/wi-token"
ROLE=arn:aws:iam::123456789012:role/vmsnap-test
start_server STS aws_meta.py sts --creds "$T/cw.json" --log "$L/sts.log" --token-file "$T/sts-expects" \
    --role-arn "$ROLE"
WI_ENV=(AWS_WEB_IDENTITY_TOKEN_FILE="$T/wi-token" AWS_ENDPOINT_URL_STS="http://127.0.0.1:$STS"
    AWS_ENDPOINT_URL_S3="$TEP")
n=$(tap_lines)
vok wi-push "${WI_ENV[@]}" AWS_ROLE_ARN="$ROLE" AWS_ROLE_SESSION_NAME=ci -- -q push "$T/set" "$U/wi"
vok wi-pull "${WI_ENV[@]}" AWS_ROLE_ARN="$ROLE" -- -q pull "$U/wi" "$T/wi.out"
same_set "$T/wi.out" || fail "web identity: the pulled set differs"
tokens_since "$n" ok "web identity"
[ "$(issued "$L/sts.log")" = 2 ] || fail "STS: credentials handed out $(issued "$L/sts.log") times, not 2"
grep -v "ua=vmsnap/$VER" "$L/sts.log" | grep -q . && fail "STS: a request without the User-Agent"
vno wi-role "${WI_ENV[@]}" AWS_ROLE_ARN=arn:aws:iam::123456789012:role/other -- ls "$U/"
has wi-role "HTTP 403 AccessDenied"
printf 'stale-token\n' >"$T/wi-stale"
vno wi-stale "${WI_ENV[@]}" AWS_ROLE_ARN="$ROLE" AWS_WEB_IDENTITY_TOKEN_FILE="$T/wi-stale" -- ls "$U/"
has wi-stale "InvalidIdentityToken"
vno wi-nofile "${WI_ENV[@]}" AWS_ROLE_ARN="$ROLE" AWS_WEB_IDENTITY_TOKEN_FILE="$T/none" -- ls "$U/"
has wi-nofile "token file $T/none: No such file or directory"
mkdir -p "$T/home/.aws"
cat >"$T/home/.aws/config" <<EOF
[profile eks]
web_identity_token_file = $T/wi-token
role_arn = $ROLE
services = local

[services local]
sts =
  endpoint_url = http://127.0.0.1:$STS
s3 =
  endpoint_url = $TEP
EOF
vok wi-profile AWS_PROFILE=eks -- ls "$U/"
grep -q "$U/wi" "$L/wi-profile.out" || fail "web identity from a profile: ls did not list the set"

# ---- the chain's order: environment, web identity, profile, container, instance metadata
c0=$(issued "$L/imds.log") s0=$(issued "$L/sts.log") t0=$(issued "$L/ct.log")
vok order-env "${IMDS_ENV[@]}" "${CT_ENV[@]}" AWS_CONTAINER_AUTHORIZATION_TOKEN="$CTOK" \
    AWS_ACCESS_KEY_ID="$RGW_AK" AWS_SECRET_ACCESS_KEY="$RGW_SK" -- ls "$U/"
vok order-wi "${IMDS_ENV[@]}" "${CT_ENV[@]}" AWS_CONTAINER_AUTHORIZATION_TOKEN="$CTOK" "${WI_ENV[@]}" \
    AWS_ROLE_ARN="$ROLE" -- ls "$U/"
[ "$(issued "$L/sts.log")" = $((s0 + 1)) ] || fail "web identity was not taken before the container"
vok order-ct "${IMDS_ENV[@]}" "${CT_ENV[@]}" AWS_CONTAINER_AUTHORIZATION_TOKEN="$CTOK" -- ls "$U/"
[ "$(issued "$L/ct.log")" = $((t0 + 1)) ] || fail "the container was not taken before instance metadata"
[ "$(issued "$L/imds.log")" = "$c0" ] || fail "instance metadata was asked while a source before it had keys"

# ---- no source gives credentials: each one tried is named, with why
vno none AWS_EC2_METADATA_DISABLED=false AWS_EC2_METADATA_SERVICE_ENDPOINT=http://127.0.0.1:1 -- ls "$U/"
has none "$U: no credentials: tried environment (AWS_ACCESS_KEY_ID not set), web identity (AWS_WEB_IDENTITY_TOKEN_FILE not set), profile \"default\" (no such profile in $T/home/.aws/credentials or $T/home/.aws/config), container (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI / _FULL_URI not set), instance metadata (http://127.0.0.1:1: Couldn't connect to server)"
vno none-off -- ls "$U/"
has none-off "instance metadata (AWS_EC2_METADATA_DISABLED=true)"
vno half AWS_ACCESS_KEY_ID="$RGW_AK" -- ls "$U/"
has half "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not"

no_secrets
done_tests
