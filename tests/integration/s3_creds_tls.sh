#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# TLS with a private CA: the test makes a CA and a server certificate with openssl and puts a TLS
# terminator (tests/servers/http_tap.py) in front of the real RGW and in front of a container
# credentials endpoint. Without the CA, requests fail and say how to trust it; with
# AWS_CA_BUNDLE, --ca-bundle, the profile's ca_bundle, CURL_CA_BUNDLE or SSL_CERT_FILE they work,
# for S3 and for the provider alike; a bundle that cannot be read is named; another CA is not
# trusted. The AWS CLI is run with the same AWS_CA_BUNDLE when installed.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/lib.sh"
. "$VMSNAP_SRC/tests/integration/s3_creds_lib.sh"
command -v openssl >/dev/null || skip "openssl is not installed (it makes the test's CA)"

P=$T/pki
mkdir -p "$P"
mkca() { # NAME: a CA key and certificate
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
        -subj "/CN=vmsnap test $1" -keyout "$P/$1.key" -out "$P/$1.pem" 2>>"$L/openssl.err" ||
        fail "openssl: CA $1"
}
mkca ca
mkca otherca
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=127.0.0.1 \
    -keyout "$P/srv.key" -out "$P/srv.csr" 2>>"$L/openssl.err" || fail "openssl: server key"
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$P/ext"
openssl x509 -req -in "$P/srv.csr" -CA "$P/ca.pem" -CAkey "$P/ca.key" -CAcreateserial -days 2 \
    -extfile "$P/ext" -out "$P/srv.pem" 2>>"$L/openssl.err" || fail "openssl: server certificate"

VER=$("$VMSNAP" --version | cut -d' ' -f2)
start_server TLS http_tap.py --target "$VMSNAP_RGW_PORT" --log "$L/tls.log" --cert "$P/srv.pem" --key "$P/srv.key"
HEP=https://127.0.0.1:$TLS
U=s3://$BUCKET
KEYS=(AWS_ACCESS_KEY_ID="$RGW_AK" AWS_SECRET_ACCESS_KEY="$RGW_SK")

# no CA: refused, saying how to trust it (not retried: a certificate does not get better)
vno no-ca "${KEYS[@]}" -- ls --endpoint "$HEP" "$U/"
has no-ca "(endpoint https://127.0.0.1:$TLS): its certificate is not trusted (give its CA with --ca-bundle FILE or AWS_CA_BUNDLE)"
grep -q "gave up after" "$L/no-ca.err" && fail "no CA: the TLS failure was retried"
vno other-ca "${KEYS[@]}" AWS_CA_BUNDLE="$P/otherca.pem" -- ls --endpoint "$HEP" "$U/"
has other-ca "its certificate is not trusted"

# AWS_CA_BUNDLE and --ca-bundle
vok env-push "${KEYS[@]}" AWS_CA_BUNDLE="$P/ca.pem" -- -q push --endpoint "$HEP" "$T/set" "$U/tls"
vok flag-pull "${KEYS[@]}" -- -q pull --ca-bundle "$P/ca.pem" --endpoint "$HEP" "$U/tls" "$T/tls.out"
same_set "$T/tls.out" || fail "over TLS: the pulled set differs"
grep -q "^GET /$BUCKET/tls/manifest.json ua=vmsnap/$VER " "$L/tls.log" ||
    fail "the requests did not go through the TLS terminator: $(head -3 "$L/tls.log")"
grep -v "ua=vmsnap/$VER" "$L/tls.log" | grep -q . && fail "an S3 request without the User-Agent"
# --ca-bundle wins over AWS_CA_BUNDLE
vok flag-wins "${KEYS[@]}" AWS_CA_BUNDLE="$P/otherca.pem" -- ls --ca-bundle "$P/ca.pem" --endpoint "$HEP" "$U/"
# what curl reads, and the profile's ca_bundle
vok curl-bundle "${KEYS[@]}" CURL_CA_BUNDLE="$P/ca.pem" -- ls --endpoint "$HEP" "$U/"
vok ssl-cert-file "${KEYS[@]}" SSL_CERT_FILE="$P/ca.pem" -- ls --endpoint "$HEP" "$U/"
mkdir -p "$T/home/.aws"
printf '[default]\nca_bundle = %s\nendpoint_url = %s\n' "$P/ca.pem" "$HEP" >"$T/home/.aws/config"
vok profile-bundle "${KEYS[@]}" -- ls "$U/"
grep -q "$U/tls" "$L/profile-bundle.out" || fail "the profile's ca_bundle and endpoint: ls did not list the set"
rm "$T/home/.aws/config"
# a bundle that cannot be read is named, before any request
vno no-file "${KEYS[@]}" -- ls --ca-bundle "$P/missing.pem" --endpoint "$HEP" "$U/"
has no-file "CA bundle $P/missing.pem (from --ca-bundle): No such file or directory"

# a credential provider over https: the same trust
creds_file "$T/cc.json" "$RGW_AK" "$RGW_SK" none 3600
start_server CT aws_meta.py container --creds "$T/cc.json" --log "$L/ct.log" --path /creds
start_server CTS http_tap.py --target "$CT" --log "$L/cts.log" --cert "$P/srv.pem" --key "$P/srv.key"
CT_ENV=(AWS_CONTAINER_CREDENTIALS_FULL_URI="https://localhost:$CTS/creds")
vno ct-no-ca "${CT_ENV[@]}" -- ls --endpoint "$HEP" "$U/"
has ct-no-ca "container credentials (https://localhost:$CTS)"
has ct-no-ca "give the CA with --ca-bundle FILE or AWS_CA_BUNDLE"
vok ct-ca "${CT_ENV[@]}" AWS_CA_BUNDLE="$P/ca.pem" -- ls --endpoint "$HEP" "$U/"
grep -q " issued" "$L/ct.log" || fail "the https container endpoint handed out nothing"

# the AWS CLI with the same setting
if command -v aws >/dev/null; then
    env "${CLEAN[@]}" "${KEYS[@]}" AWS_CA_BUNDLE="$P/ca.pem" aws s3 ls --endpoint-url "$HEP" "$U/" \
        >"$L/aws-ls.out" 2>"$L/aws-ls.err" || fail "aws s3 ls with AWS_CA_BUNDLE: $(tail -c 300 "$L/aws-ls.err")"
    grep -q "PRE tls/" "$L/aws-ls.out" || fail "aws s3 ls over TLS did not list tls/"
else
    echo "note: awscli is not installed: its half of the TLS check is skipped" >&2
fi

no_secrets
done_tests
