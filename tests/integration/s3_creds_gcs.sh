#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# gs:// with Google OAuth 2.0 access tokens end to end against the real RGW: a service-account
# key (GOOGLE_APPLICATION_CREDENTIALS; its JWT signed with a key pair made here by openssl),
# gcloud's authorized-user file, and the GCE metadata server, each source played by
# tests/servers/gcp_meta.py on loopback (the token endpoint verifies the JWT's RS256 signature
# with the public key and its claims; the metadata server wants Metadata-Flavor: Google), with
# tokens that expire. RGW does not take Google's tokens, so tests/servers/gcs_front.py plays
# Cloud Storage's front door: it takes a request only with "Authorization: Bearer" and a token
# that was issued and has not expired (from the token servers' files), refuses it (401) as GCS
# would otherwise, and sends it on to RGW signed with RGW's keys.
#
# Checked: push, ls, pull, rm of a set through each source; a token refreshed mid-push for both
# kinds of source (short-lived tokens, a push slowed by the front door so that it outlives the
# first token: the token endpoint asked more than once, no request refused, the first token then
# refused by the front door); HMAC keys still first; the order of the sources; a wrong key (bad
# signature), a refused token, an unusable credentials file, a metadata server absent or not
# answering as one: each a clear error with its exit class; no secret in any output.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/lib.sh"
. "$VMSNAP_SRC/tests/integration/s3_creds_lib.sh"
command -v openssl >/dev/null || skip "openssl is not installed (it makes and checks the key pair)"

VER=$("$VMSNAP" --version | cut -d' ' -f2)
U=gs://$BUCKET
SA=vmsnap-test@vmsnap-test.iam.gserviceaccount.com
CID=vmsnap-test-client.apps.googleusercontent.com

# ---- the key pairs: the service account's (its public half given to the token endpoint) and
# another one the endpoint does not know
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$T/sa.pem" 2>/dev/null
openssl pkey -in "$T/sa.pem" -pubout -out "$T/sa.pub" 2>/dev/null
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$T/wrong.pem" 2>/dev/null
for f in "$T/sa.pem" "$T/wrong.pem"; do
    while read -r line; do
        case $line in -----*) ;; *) SECRETS+=("$line") ;; esac
    done <"$f"
done
mktoken CSEC # the authorized user's client secret
mktoken RTOK # and refresh token
printf '%s\n' "$RTOK" >"$T/refresh-token"

# keyfile OUT PEM TOKEN_URI [TYPE]: a service-account key file as Google makes them
keyfile() {
    python3 - "$@" <<'EOF'
import json, sys
out, pem, uri = sys.argv[1:4]
kind = sys.argv[4] if len(sys.argv) > 4 else "service_account"
d = {"type": kind, "project_id": "vmsnap-test", "private_key_id": "k1",
     "private_key": open(pem).read(), "client_email": "vmsnap-test@vmsnap-test.iam.gserviceaccount.com",
     "client_id": "1", "token_uri": uri}
json.dump(d, open(out, "w"), indent=2)
EOF
}
# userfile OUT TOKEN_URI: gcloud's authorized-user file
userfile() {
    printf '{"type":"authorized_user","client_id":"%s","client_secret":"%s","refresh_token":"%s","token_uri":"%s"}\n' \
        "$CID" "$CSEC" "$RTOK" "$2" >"$1"
}
issued_n() { # LOG: tokens handed out
    local n
    n=$(grep -c ' issued n=' "$1" 2>/dev/null) || true
    echo "${n:-0}"
}
lines() { if [ -f "$1" ]; then wc -l <"$1"; else echo 0; fi; }
# none_refused LOG N WHAT: no request after line N of a front door log was refused
none_refused() {
    if tail -n +$(($2 + 1)) "$1" | grep -q refused=; then
        fail "$3: the front door refused requests: $(tail -n +$(($2 + 1)) "$1" | grep refused= | sort | uniq -c | head -5)"
    fi
}

# ---- the servers: a token endpoint, a metadata server, the front door (RGW's keys from the
# environment, not the command line)
start_server TOK gcp_meta.py token --tokens "$T/tokens-tok.json" --log "$L/tok.log" --pubkey "$T/sa.pub" \
    --email "$SA" --client-id "$CID" --client-secret "$CSEC" --refresh-token-file "$T/refresh-token"
TURI=http://127.0.0.1:$TOK/token
start_server META gcp_meta.py metadata --tokens "$T/tokens-meta.json" --log "$L/meta.log"
# start_front VAR LOG TOKEN_FILE... [-- OPTIONS]: a front door on RGW
start_front() {
    local var=$1 log=$2 args=()
    shift 2
    while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=(--tokens "$1"); shift; done
    [ $# -gt 0 ] && shift
    export GCS_FRONT_AK=$RGW_AK GCS_FRONT_SK=$RGW_SK
    start_server "$var" gcs_front.py --rgw "$RGW_EP" --log "$log" "${args[@]}" "$@"
    export -n GCS_FRONT_AK GCS_FRONT_SK
    touch "$log"
}
start_front FRONT "$L/front.log" "$T/tokens-tok.json" "$T/tokens-meta.json"
G=(VMSNAP_GS_ENDPOINT="http://127.0.0.1:$FRONT")

# the servers play their parts: the front door refuses a request without a token or with an
# unknown one; the metadata server refuses a request without Metadata-Flavor
code() { curl -s -o /dev/null -w '%{http_code}' "$@"; }
[ "$(code "http://127.0.0.1:$FRONT/$BUCKET/")" = 401 ] || fail "the front door took a request without a token"
[ "$(code -H 'Authorization: Bearer ya29.made-up' "http://127.0.0.1:$FRONT/$BUCKET/")" = 401 ] ||
    fail "the front door took a token nobody issued"
[ "$(code "http://127.0.0.1:$META/computeMetadata/v1/instance/service-accounts/default/token")" = 403 ] ||
    fail "the metadata server answered without Metadata-Flavor"
: >"$L/front.log"
: >"$L/meta.log"

# ---- a service-account key (GOOGLE_APPLICATION_CREDENTIALS): push, ls, pull, rm
keyfile "$T/sa.json" "$T/sa.pem" "$TURI"
SAE=("${G[@]}" GOOGLE_APPLICATION_CREDENTIALS="$T/sa.json")
vok sa-push "${SAE[@]}" -- -v push "$T/set" "$U/sa"
grep -q "credentials from the GOOGLE_APPLICATION_CREDENTIALS file, valid for" "$L/sa-push.err" ||
    fail "sa: -v does not name the source: $(grep credentials "$L/sa-push.err")"
vok sa-ls "${SAE[@]}" -- ls "$U/"
grep -q "$U/sa" "$L/sa-ls.out" || fail "sa: ls does not list the set: $(cat "$L/sa-ls.out")"
vok sa-pull "${SAE[@]}" -- -q pull "$U/sa" "$T/sa.out"
same_set "$T/sa.out" || fail "sa: the pulled set differs"
vok sa-rm "${SAE[@]}" -- -q rm "$U/sa"
vok sa-ls2 "${SAE[@]}" -- ls "$U/"
grep -q "$U/sa" "$L/sa-ls2.out" && fail "sa: the set is still listed after rm"
[ "$(issued_n "$L/tok.log")" = 5 ] || fail "sa: $(issued_n "$L/tok.log") tokens for 5 runs: $(cat "$L/tok.log")"
grep -q "^POST /token 200 ua=vmsnap/$VER issued n=1 grant=jwt$" "$L/tok.log" ||
    fail "sa: no JWT grant with vmsnap's User-Agent: $(head -3 "$L/tok.log")"
grep -q ' tok=[0-9]' "$L/front.log" || fail "sa: no request reached the front door with a token"
none_refused "$L/front.log" 0 "sa"

# ---- gcloud's file: authorized user under ~/.config/gcloud, a service account under
# $CLOUDSDK_CONFIG; each taken only without GOOGLE_APPLICATION_CREDENTIALS
mkdir -p "$T/home/.config/gcloud" "$T/cloudsdk"
userfile "$T/home/.config/gcloud/application_default_credentials.json" "$TURI"
n=$(lines "$L/front.log")
vok user-ls "${G[@]}" -- -v ls "$U/"
grep -q "credentials from the gcloud credentials file" "$L/user-ls.err" || fail "gcloud: not the source used"
grep -q "issued n=6 grant=refresh$" "$L/tok.log" || fail "gcloud: no refresh-token grant: $(tail -2 "$L/tok.log")"
cp "$T/sa.json" "$T/cloudsdk/application_default_credentials.json"
vok cloudsdk-ls "${G[@]}" CLOUDSDK_CONFIG="$T/cloudsdk" -- ls "$U/"
grep -q "issued n=7 grant=jwt$" "$L/tok.log" || fail "CLOUDSDK_CONFIG: its service account was not used"
none_refused "$L/front.log" "$n" "gcloud"
userfile "$T/badrefresh.json" "$TURI"
sed -i "s/$RTOK/revoked-$RANDOM/" "$T/badrefresh.json"
vno user-revoked "${G[@]}" GOOGLE_APPLICATION_CREDENTIALS="$T/badrefresh.json" -- ls "$U/"
has user-revoked "GOOGLE_APPLICATION_CREDENTIALS $T/badrefresh.json: the token endpoint http://127.0.0.1:$TOK refused the refresh token: HTTP 400 invalid_grant"
rm -f "$T/home/.config/gcloud/application_default_credentials.json"

# ---- the GCE metadata server: push, ls, pull, rm
ME=("${G[@]}" NO_GCE_CHECK=false GCE_METADATA_HOST="127.0.0.1:$META")
n=$(lines "$L/front.log")
vok md-push "${ME[@]}" -- -v -v push "$T/set" "$U/md"
grep -q "credentials from the GCE metadata server, valid for" "$L/md-push.err" || fail "metadata: not the source used"
vok md-ls "${ME[@]}" -- ls "$U/"
grep -q "$U/md" "$L/md-ls.out" || fail "metadata: ls does not list the set"
vok md-pull "${ME[@]}" -- -q pull "$U/md" "$T/md.out"
same_set "$T/md.out" || fail "metadata: the pulled set differs"
vok md-rm "${ME[@]}" -- -q rm "$U/md"
[ "$(issued_n "$L/meta.log")" = 4 ] || fail "metadata: $(issued_n "$L/meta.log") tokens for 4 runs"
grep -q "refused=flavor" "$L/meta.log" && fail "vmsnap asked the metadata server without Metadata-Flavor"
grep -v "ua=vmsnap/$VER" "$L/meta.log" | grep -q . && fail "metadata: a request without the User-Agent"
none_refused "$L/front.log" "$n" "metadata"

# ---- the order: HMAC keys first, then GOOGLE_APPLICATION_CREDENTIALS, then gcloud's file,
# then the metadata server
t0=$(issued_n "$L/tok.log") m0=$(issued_n "$L/meta.log")
vok order-hmac "${ME[@]}" GOOGLE_APPLICATION_CREDENTIALS="$T/sa.json" GS_ACCESS_KEY_ID="$RGW_AK" \
    GS_SECRET_ACCESS_KEY="$RGW_SK" AWS_REGION=us-east-1 VMSNAP_GS_ENDPOINT="$RGW_EP" -- ls "$U/"
[ "$(issued_n "$L/tok.log")$(issued_n "$L/meta.log")" = "$t0$m0" ] ||
    fail "a token was fetched while HMAC keys were given"
vok order-gac "${ME[@]}" GOOGLE_APPLICATION_CREDENTIALS="$T/sa.json" -- ls "$U/"
[ "$(issued_n "$L/tok.log")" = $((t0 + 1)) ] && [ "$(issued_n "$L/meta.log")" = "$m0" ] ||
    fail "GOOGLE_APPLICATION_CREDENTIALS was not taken before the metadata server"
vok order-gcloud "${ME[@]}" CLOUDSDK_CONFIG="$T/cloudsdk" -- ls "$U/"
[ "$(issued_n "$L/tok.log")" = $((t0 + 2)) ] && [ "$(issued_n "$L/meta.log")" = "$m0" ] ||
    fail "gcloud's file was not taken before the metadata server"

# ---- failures: each names its source and where, with the exit class of docs/cli.md
m0=$(issued_n "$L/meta.log")
keyfile "$T/wrong.json" "$T/wrong.pem" "$TURI"
rc=0
vrun wrong-key "${ME[@]}" GOOGLE_APPLICATION_CREDENTIALS="$T/wrong.json" -- ls "$U/" || rc=$?
[ "$rc" = 4 ] || fail "a key the token endpoint does not know: exit $rc, not 4 (access denied)"
has wrong-key "GOOGLE_APPLICATION_CREDENTIALS $T/wrong.json: the token endpoint http://127.0.0.1:$TOK refused the JWT of $SA: HTTP 400 invalid_grant: Invalid JWT Signature."
grep -q "refused=signature" "$L/tok.log" || fail "the token endpoint did not see a bad signature"
[ "$(issued_n "$L/meta.log")" = "$m0" ] ||
    fail "a key file that failed fell through to the metadata server (a configured source stops the chain)"

start_front NOFRONT "$L/nofront.log" "$T/nothing.json"
rc=0
vrun refused GOOGLE_APPLICATION_CREDENTIALS="$T/sa.json" VMSNAP_GS_ENDPOINT="http://127.0.0.1:$NOFRONT" -- ls "$U/" || rc=$?
[ "$rc" = 4 ] || fail "a token the store refuses: exit $rc, not 4 (access denied)"
has refused "access denied to bucket '$BUCKET' (HTTP 401 AuthenticationRequired)"

printf 'not json\n' >"$T/notjson.json"
vno notjson GOOGLE_APPLICATION_CREDENTIALS="$T/notjson.json" -- ls "$U/"
has notjson "GOOGLE_APPLICATION_CREDENTIALS $T/notjson.json: not a JSON object"
keyfile "$T/ext.json" "$T/sa.pem" "$TURI" external_account
vno external GOOGLE_APPLICATION_CREDENTIALS="$T/ext.json" -- ls "$U/"
has external "external_account (workload identity federation) is not supported"
keyfile "$T/plain.json" "$T/sa.pem" http://192.0.2.1/token
vno plainhttp GOOGLE_APPLICATION_CREDENTIALS="$T/plain.json" -- ls "$U/"
has plainhttp "token_uri http://192.0.2.1: expected https://"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["private_key"]="-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"; json.dump(d,open(sys.argv[2],"w"))' \
    "$T/sa.json" "$T/badpem.json"
vno badpem GOOGLE_APPLICATION_CREDENTIALS="$T/badpem.json" -- ls "$U/"
has badpem "$T/badpem.json: private_key is not an unencrypted PEM private key"
rc=0
vrun nofile GOOGLE_APPLICATION_CREDENTIALS="$T/none.json" -- ls "$U/" || rc=$?
[ "$rc" = 3 ] || fail "a missing key file: exit $rc, not 3 (not found)"
has nofile "GOOGLE_APPLICATION_CREDENTIALS $T/none.json: open $T/none.json: No such file or directory"

# the metadata server absent (nothing listens there), turned off, or not one (no Flavor in its
# answers): no credentials, each source named
free_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
rc=0
vrun md-absent NO_GCE_CHECK=false GCE_METADATA_HOST="127.0.0.1:$free_port" -- ls "$U/" || rc=$?
[ "$rc" = 4 ] || fail "no metadata server: exit $rc, not 4"
has md-absent "$U: no credentials: tried environment (GS_ACCESS_KEY_ID and AWS_ACCESS_KEY_ID not set)"
has md-absent "GOOGLE_APPLICATION_CREDENTIALS (not set), gcloud credentials (no $T/home/.config/gcloud/application_default_credentials.json), GCE metadata server (http://127.0.0.1:$free_port: Couldn't connect to server)"
vno md-off -- ls "$U/"
has md-off "GCE metadata server (NO_GCE_CHECK=true)"
start_server NOFLAVOR gcp_meta.py metadata --tokens "$T/tokens-noflavor.json" --log "$L/noflavor.log" --no-flavor
rc=0
vrun md-noflavor "${G[@]}" NO_GCE_CHECK=false GCE_METADATA_HOST="127.0.0.1:$NOFLAVOR" -- ls "$U/" || rc=$?
[ "$rc" = 4 ] || fail "a metadata server without Metadata-Flavor: exit $rc, not 4"
has md-noflavor "GCE metadata server (http://127.0.0.1:$NOFLAVOR: the answer (HTTP 200) lacks 'Metadata-Flavor: Google': not a GCE metadata server)"
[ "$(issued_n "$L/noflavor.log")" -ge 1 ] || fail "the metadata server without Flavor was not asked"

# ---- refresh mid-push, for each kind of source: tokens live TTL s (refreshed after half
# that); the front door holds every part DELAY ms, so the push of PARTS parts on J connections
# lasts at least PARTS / J * DELAY = 12 s, past the first token's expiry by construction
TTL=8
J=2
PARTS=12
DELAY=2000
mkdir -p "$T/bigset"
head -c $((PARTS * 5 * 1024 * 1024)) /dev/urandom >"$T/bigset/memory"
echo '{"vcpus":2}' >"$T/bigset/state.json"
# slow_push NAME TOKENS LOG SOURCE ENV...: the slow push through a fresh front door, then checks
slow_push() {
    local name=$1 tokens=$2 log=$3 source=$4 rc=0 first
    shift 4
    local port_var=SLOW_${name//-/_}
    start_front "$port_var" "$L/front-$name.log" "$tokens" -- --delay-ms "$DELAY"
    vrun "$name" VMSNAP_GS_ENDPOINT="http://127.0.0.1:${!port_var}" VMSNAP_S3_ATTEMPTS=1 "$@" -- \
        -v push -j "$J" --part-size 5M "$T/bigset" "$U/$name" || rc=$?
    [ "$rc" = 0 ] || fail "$name: the push across the refresh failed (exit $rc): $(tail -c 400 "$L/$name.err")"
    grep -q "credentials refreshed from the $source" "$L/$name.err" ||
        fail "$name: the push does not say it refreshed: $(grep credentials "$L/$name.err")"
    [ "$(issued_n "$log")" -ge 2 ] || fail "$name: $(issued_n "$log") token(s) handed out, not >= 2"
    none_refused "$L/front-$name.log" 0 "$name"
    grep -q ' late' "$L/front-$name.log" ||
        fail "$name: the push ended before the first token expired: it cannot show the refresh"
    grep -q ' tok=1\b' "$L/front-$name.log" && grep -Eq ' tok=([2-9]|[1-9][0-9]+)\b' "$L/front-$name.log" ||
        fail "$name: the requests did not carry both the first token and a later one"
    # the first token, expired: the front door refuses it (so the push needed the refresh)
    first=$(python3 -c 'import json,sys; print([k for k, v in json.load(open(sys.argv[1])).items() if v["n"] == 1][0])' "$tokens")
    [ "$(code -H "Authorization: Bearer $first" "http://127.0.0.1:${!port_var}/$BUCKET/")" = 401 ] ||
        fail "$name: the front door still takes the first token"
    vok "$name-pull" VMSNAP_GS_ENDPOINT="http://127.0.0.1:${!port_var}" "$@" -- -q pull "$U/$name" "$T/$name.out"
    diff -r "$T/bigset" "$T/$name.out" >/dev/null || fail "$name: the pulled set differs"
}
start_server TOKS gcp_meta.py token --tokens "$T/tokens-toks.json" --log "$L/toks.log" --ttl "$TTL" \
    --pubkey "$T/sa.pub" --email "$SA"
keyfile "$T/sas.json" "$T/sa.pem" "http://127.0.0.1:$TOKS/token"
slow_push refresh-sa "$T/tokens-toks.json" "$L/toks.log" "GOOGLE_APPLICATION_CREDENTIALS file" \
    GOOGLE_APPLICATION_CREDENTIALS="$T/sas.json"
start_server METAS gcp_meta.py metadata --tokens "$T/tokens-metas.json" --log "$L/metas.log" --ttl "$TTL"
slow_push refresh-md "$T/tokens-metas.json" "$L/metas.log" "GCE metadata server" \
    NO_GCE_CHECK=false GCE_METADATA_HOST="127.0.0.1:$METAS"

# ---- no secret anywhere: the keys' PEM lines, the client secret, the refresh token, and every
# access token any server issued
for f in "$T"/tokens-*.json; do
    while read -r tk; do SECRETS+=("$tk"); done < <(python3 -c 'import json,sys; print("\n".join(json.load(open(sys.argv[1]))))' "$f")
done
[ "${#SECRETS[@]}" -gt 60 ] || fail "too few secrets collected (${#SECRETS[@]}) for the final check"
no_secrets
done_tests
