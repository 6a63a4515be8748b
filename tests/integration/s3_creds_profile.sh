#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The AWS shared files against the real RGW: profiles in the credentials and config files,
# AWS_PROFILE and --profile, region and endpoint_url (and the nested s3 endpoint_url /
# addressing_style) from the config, the precedence flag > environment > config file, keys in the
# config file, credential_process, strict parsing (file:line, no value echoed), and the same setup
# working for `aws s3 ls` and `vmsnap ls`. A logging relay in front of RGW (tests/servers/
# http_tap.py) shows which region each request was signed for and its User-Agent.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/lib.sh"
. "$VMSNAP_SRC/tests/integration/s3_creds_lib.sh"

mkkey KA # profile dev's keys (credentials file)
mkkey KB # profile cfgkeys' keys (config file) and credential_process's
start_server TAP http_tap.py --target "$VMSNAP_RGW_PORT" --log "$L/tap.log"
TEP=http://127.0.0.1:$TAP
A=$T/home/.aws
mkdir -p "$A"
cat >"$A/credentials" <<EOF
# the default profile's keys are wrong: a run that takes it is refused by RGW
[default]
aws_access_key_id = WRONGKEY$$
aws_secret_access_key = wrongsecret$$

[dev]
aws_access_key_id = $KA_AK
aws_secret_access_key = $KA_SK
EOF
cat >"$A/config" <<EOF
[default]
region = us-east-1
endpoint_url = $TEP

; profile dev: region and endpoint from here, keys from the credentials file
[profile dev]
region = eu-test-1
endpoint_url = $TEP
s3 =
  addressing_style = path

[profile cfgkeys]
aws_access_key_id = $KB_AK
aws_secret_access_key = $KB_SK
region = cfg-region-2
services = rgw
s3 =
    addressing_style = path

[services rgw]
s3 =
  endpoint_url = $TEP

# vmsnap also takes endpoint_url nested under s3 = in the profile itself
[profile nested]
aws_access_key_id = $KB_AK
aws_secret_access_key = $KB_SK
s3 =
  endpoint_url = $TEP

[profile proc]
credential_process = sh $T/proc.sh
region = proc-region-3
endpoint_url = $TEP

[profile badproc]
credential_process = sh -c 'echo oops >&2; exit 3'
endpoint_url = $TEP

[profile noversion]
credential_process = echo '{"AccessKeyId":"$KB_AK","SecretAccessKey":"$KB_SK"}'
endpoint_url = $TEP

[profile half]
aws_access_key_id = $KB_AK
endpoint_url = $TEP

[profile sso]
sso_session = corp
endpoint_url = $TEP
EOF
cat >"$T/proc.sh" <<EOF
echo run >>"$T/proc.count"
printf '{"Version": 1, "AccessKeyId": "%s", "SecretAccessKey": "%s"}\n' "$KB_AK" "$KB_SK"
EOF
U=s3://$BUCKET

# regions the requests since line N of the tap log were signed for
tap_lines() { touch "$L/tap.log"; wc -l <"$L/tap.log"; }
regions_since() { tail -n +$(($1 + 1)) "$L/tap.log" | sed -n 's/.* region=\([^ ]*\).*/\1/p' | sort -u | tr '\n' ' '; }

# AWS_PROFILE=dev: keys from the credentials file, region and endpoint from the config file
n=$(tap_lines)
vok dev-push AWS_PROFILE=dev -- -q push "$T/set" "$U/dev"
vok dev-pull AWS_PROFILE=dev -- -q pull "$U/dev" "$T/dev.out"
same_set "$T/dev.out" || fail "profile dev: the pulled set differs"
[ "$(regions_since "$n")" = "eu-test-1 " ] || fail "profile dev: signed for regions '$(regions_since "$n")', not eu-test-1"
[ "$(tap_lines)" -gt "$n" ] || fail "profile dev: the config file's endpoint_url was not used"
grep -q "ua=vmsnap/" "$L/tap.log" || fail "no User-Agent vmsnap/... at the endpoint: $(head -3 "$L/tap.log")"
grep -v "ua=vmsnap/[0-9]" "$L/tap.log" | grep -q . && fail "a request without the User-Agent: $(grep -v 'ua=vmsnap/' "$L/tap.log" | head -2)"

# --profile dev wins over AWS_PROFILE; without either the default profile (wrong keys) is used
vok flag-ls AWS_PROFILE=default -- ls --profile dev "$U/"
grep -q "$U/dev" "$L/flag-ls.out" || fail "--profile dev: ls did not list the set: $(cat "$L/flag-ls.out")"
vno default-ls -- ls "$U/"
has default-ls "access denied"

# the environment's keys win over AWS_PROFILE (as the AWS CLI), but are not used with --profile
vok env-over-profile AWS_PROFILE=default AWS_ACCESS_KEY_ID="$RGW_AK" AWS_SECRET_ACCESS_KEY="$RGW_SK" -- ls "$U/"
vno flag-over-env AWS_ACCESS_KEY_ID="$RGW_AK" AWS_SECRET_ACCESS_KEY="$RGW_SK" -- ls --profile default "$U/"
has flag-over-env "access denied"

# region: --region > AWS_REGION > AWS_DEFAULT_REGION > the config file
n=$(tap_lines)
vok region-env AWS_PROFILE=dev AWS_DEFAULT_REGION=def-region -- ls "$U/"
[ "$(regions_since "$n")" = "def-region " ] || fail "AWS_DEFAULT_REGION: signed for '$(regions_since "$n")'"
n=$(tap_lines)
vok region-env2 AWS_PROFILE=dev AWS_DEFAULT_REGION=def-region AWS_REGION=env-region -- ls "$U/"
[ "$(regions_since "$n")" = "env-region " ] || fail "AWS_REGION: signed for '$(regions_since "$n")'"
n=$(tap_lines)
vok region-flag AWS_PROFILE=dev AWS_REGION=env-region -- ls --region flag-region "$U/"
[ "$(regions_since "$n")" = "flag-region " ] || fail "--region: signed for '$(regions_since "$n")'"

# endpoint: AWS_ENDPOINT_URL_S3 and AWS_ENDPOINT_URL win over the config file (straight to RGW,
# past the relay), --endpoint over both
for v in AWS_ENDPOINT_URL_S3 AWS_ENDPOINT_URL; do
    n=$(tap_lines)
    vok "ep-$v" AWS_PROFILE=dev "$v=$RGW_EP" -- ls "$U/"
    [ "$(tap_lines)" = "$n" ] || fail "$v did not win over the config file's endpoint_url"
done
n=$(tap_lines)
vok ep-flag AWS_PROFILE=dev AWS_ENDPOINT_URL_S3=http://127.0.0.1:9 -- ls --endpoint "$RGW_EP" "$U/"
[ "$(tap_lines)" = "$n" ] || fail "--endpoint did not win"

# keys in the config file, the endpoint from a [services] section; or nested in the profile
n=$(tap_lines)
vok cfgkeys AWS_PROFILE=cfgkeys -- ls "$U/"
grep -q "$U/dev" "$L/cfgkeys.out" || fail "profile cfgkeys: ls did not list the set"
[ "$(regions_since "$n")" = "cfg-region-2 " ] || fail "profile cfgkeys: signed for '$(regions_since "$n")'"
n=$(tap_lines)
vok nested AWS_PROFILE=nested -- ls "$U/"
[ "$(tap_lines)" -gt "$n" ] || fail "profile nested: the s3 = endpoint_url was not used"

# credential_process
vok proc -- -q push --profile proc "$T/set" "$U/proc"
[ -s "$T/proc.count" ] || fail "credential_process was not run"
vno badproc -- ls --profile badproc "$U/"
has badproc "credential_process: the command exited with status 3"
vno noversion -- ls --profile noversion "$U/"
has noversion '"Version": 1'

# profiles that cannot work say why
vno half AWS_PROFILE=half -- ls "$U/"
has half "aws_access_key_id is set but aws_secret_access_key is not"
vno sso AWS_PROFILE=sso -- ls "$U/"
has sso "SSO is not supported"
vno nosuch -- ls --profile nosuch "$U/"
has nosuch "profile \"nosuch\" (--profile) is in neither $A/credentials nor $A/config"
vno badattempts AWS_PROFILE=dev AWS_MAX_ATTEMPTS=lots -- ls "$U/"
has badattempts "AWS_MAX_ATTEMPTS"

# AWS_SHARED_CREDENTIALS_FILE / AWS_CONFIG_FILE elsewhere; a bad line is refused by file and
# line, without echoing it (a secret with a missing '=')
mkdir "$T/elsewhere"
cp "$A/credentials" "$T/elsewhere/c"
cp "$A/config" "$T/elsewhere/k"
vok files-env AWS_SHARED_CREDENTIALS_FILE="$T/elsewhere/c" AWS_CONFIG_FILE="$T/elsewhere/k" \
    HOME="$T/nohome" AWS_PROFILE=dev -- ls "$U/"
printf '[dev]\naws_access_key_id = %s\naws_secret_access_key %s\n' "$KA_AK" "$KA_SK" >"$T/elsewhere/bad"
vno badline AWS_SHARED_CREDENTIALS_FILE="$T/elsewhere/bad" AWS_PROFILE=dev -- ls "$U/"
has badline "$T/elsewhere/bad:3: expected 'KEY = VALUE'"
printf '  region = x\n[profile dev]\n' >"$T/elsewhere/bad2"
vno badindent AWS_CONFIG_FILE="$T/elsewhere/bad2" AWS_PROFILE=dev -- ls "$U/"
has badindent "$T/elsewhere/bad2:1: an indented line outside a nested block"
printf '[dev]\naws_access_key_id = a\naws_access_key_id = b\n' >"$T/elsewhere/dup"
vno dupkey AWS_SHARED_CREDENTIALS_FILE="$T/elsewhere/dup" AWS_PROFILE=dev -- ls "$U/"
has dupkey "$T/elsewhere/dup:3: 'aws_access_key_id' set twice"

# the same setup works for the AWS CLI
if command -v aws >/dev/null; then
    if env "${CLEAN[@]}" AWS_PROFILE=dev aws s3 ls "$U/" >"$L/aws-ls.out" 2>"$L/aws-ls.err"; then
        grep -q "PRE dev/" "$L/aws-ls.out" || fail "aws s3 ls did not list dev/: $(cat "$L/aws-ls.out")"
    else
        fail "aws s3 ls with AWS_PROFILE=dev failed: $(tail -c 300 "$L/aws-ls.err")"
    fi
    vok vm-ls AWS_PROFILE=dev -- ls "$U/"
    grep -q "$U/dev" "$L/vm-ls.out" || fail "vmsnap ls with AWS_PROFILE=dev did not list dev"
    env "${CLEAN[@]}" aws s3 ls --profile cfgkeys "$U/" >"$L/aws-ls2.out" 2>"$L/aws-ls2.err" ||
        fail "aws s3 ls --profile cfgkeys failed: $(tail -c 300 "$L/aws-ls2.err")"
else
    echo "note: awscli is not installed: the aws s3 ls half of the parity check is skipped" >&2
fi

no_secrets
done_tests
