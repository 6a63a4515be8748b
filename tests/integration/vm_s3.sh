#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# suspend to a real Ceph RGW (the xfer_rgw fixture) -> resume under another state directory:
# both counters continue. S3 down before a suspend (the endpoint refuses connections) or the
# credentials refused: the suspend fails before it stops the guest, which runs on. S3 failing
# during the upload (a proxy resets every part): the local checkpoint survives, the error says
# so, and a later suspend to the real RGW succeeds. A suspend
# interrupted during its upload keeps its checkpoint locally and leaves nothing in the bucket. A
# suspend over a base of the same frames: copied inside RGW, and counted. The store's options
# (--endpoint, --retries) on suspend and resume.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/integration/vm_lib.sh"
# the reference layout's contract (objects at <set>/<name>.zstd, --base copies); the layered
# layout's suspends and resumes are tests/integration/vm_layers.sh
export VMSNAP_LAYOUT=reference
. "$VMSNAP_SRC/tests/integration/xfer_s3_lib.sh"
A=$T/node-a
B=$T/node-b
from_golden "$A"
VM_DIRS+=("$B")
resume_check "$A" golden "$golden_ram" "$golden_data" || done_tests
sleep 1

# S3 down: a port nothing listens on (picked free, then left closed), two attempts per request
down=$((20000 + RANDOM % 20000))
while (exec 3<>"/dev/tcp/127.0.0.1/$down") 2>/dev/null; do down=$((down + 1)); done
# the suspend asks the store before it stops the guest: it fails with the VM running on
qpid0=$(cat "$A/vms/golden/pid")
AWS_ENDPOINT_URL=http://127.0.0.1:$down VMSNAP_S3_ATTEMPTS=2 \
    expect_fail "suspend with S3 down" vmc "$A" suspend golden "s3://$BUCKET/down"
grep -q 'nothing was stopped or changed: .*cannot be written' "$T/err" ||
    fail "S3-down suspend does not say the VM was left alone: $(cat "$T/err")"
grep -q "$AWS_SECRET_ACCESS_KEY" "$T/err" && fail "the secret key appears in an error"
vmc "$A" ls | grep -Eq '^golden +running' || fail "ls after S3-down suspend: $(vmc "$A" ls)"
[ "$(cat "$A/vms/golden/pid")" = "$qpid0" ] && kill -0 "$qpid0" ||
    fail "S3-down suspend did not leave the guest's QEMU running"
# credentials the store refuses: the same, and the secret in no output
AWS_SECRET_ACCESS_KEY=wrong-$AWS_SECRET_ACCESS_KEY VMSNAP_S3_ATTEMPTS=2 \
    expect_fail "suspend with a wrong secret" vmc "$A" suspend golden "s3://$BUCKET/badkey"
grep -q 'nothing was stopped or changed: .*cannot be written' "$T/err" ||
    fail "suspend with a wrong secret: $(cat "$T/err")"
grep -q "$AWS_SECRET_ACCESS_KEY" "$T/err" && fail "the secret key appears in an error"
vmc "$A" ls | grep -Eq '^golden +running' || fail "ls after a suspend with a wrong secret: $(vmc "$A" ls)"
OUT=$T/probe.xml s3curl GET "$BUCKET/?prefix=badkey/" >/dev/null
grep -q '<Key>' "$T/probe.xml" && fail "the refused suspend left objects: $(grep -o '<Key>[^<]*' "$T/probe.xml")"
# the store's options on the VM verbs, as on push: --endpoint over the environment's (a dead
# port) and --retries (0: one 503 to the store's test fails the suspend, before the guest stops;
# the proxy answered it: the error is its 503, not the dead port's refusal)
start_proxy "1:503"
AWS_ENDPOINT_URL=http://127.0.0.1:$down expect_fail "suspend with --retries 0 over a 503" \
    vmc "$A" suspend golden "s3://$BUCKET/r0" --endpoint "$PEP" --retries 0
stop_proxy
grep -q 'nothing was stopped or changed: .*503' "$T/err" ||
    fail "suspend --endpoint PROXY --retries 0 over a 503: $(cat "$T/err")"
[ "$(cat "$A/vms/golden/pid")" = "$qpid0" ] && kill -0 "$qpid0" ||
    fail "the suspend refused by its store's test did not leave the guest's QEMU running"
rc=0 && vmc "$A" suspend golden "s3://$BUCKET/r0" --retries 101 2>"$T/err" || rc=$?
[ "$rc" = 2 ] && grep -q -- '--retries wants 0 to 100' "$T/err" || fail "vm suspend --retries 101: exit $rc: $(cat "$T/err")"
# the store answering the test (requests 1 and 2) but nothing after it (reset): the
# guest was stopped, its checkpoint is kept locally, and the error says so
start_proxy "3+:reset"
AWS_ENDPOINT_URL=$PEP VMSNAP_S3_ATTEMPTS=2 \
    expect_fail "suspend with the store gone after its test" vmc "$A" suspend golden "s3://$BUCKET/down"
stop_proxy
grep -q 'kept locally' "$T/err" || fail "S3-down suspend does not say the checkpoint is kept: $(cat "$T/err")"
grep -q "$AWS_SECRET_ACCESS_KEY" "$T/err" && fail "the secret key appears in an error"
[ -f "$A/vms/golden/checkpoint/memory-ranges" ] || fail "S3-down suspend lost the local checkpoint"
vmc "$A" ls | grep -Eq '^golden +paused .*checkpoint' || fail "ls after S3-down suspend: $(vmc "$A" ls)"
read -r r d <<<"$(last_counter "$A" golden)"

# a later suspend (of the kept checkpoint, the VM being stopped) succeeds; resume elsewhere
# (both through --endpoint, the environment's a dead port; the suspend's first request answered
# 503 and retried)
start_proxy "1:503"
AWS_ENDPOINT_URL=http://127.0.0.1:$down vmc "$A" suspend golden "s3://$BUCKET/vm0" --endpoint "$PEP" --retries 1 2>"$T/err" ||
    fail "suspend of the kept checkpoint to RGW: $(cat "$T/err")"
[ "$(head_code vm0/manifest.json)" = 200 ] || fail "no manifest for the kept checkpoint"
[ ! -e "$A/vms/golden/checkpoint" ] || fail "local checkpoint left after the later suspend"
AWS_ENDPOINT_URL=http://127.0.0.1:$down resume_check "$B" golden "$r" "$d" "s3://$BUCKET/vm0" --endpoint "$PEP" || done_tests
stop_proxy
# and a running VM: suspend to the real RGW and resume back on the first node
sleep 1
"$VMSNAP" -v vm suspend golden "s3://$BUCKET/vm1" --state-dir "$B" 2>"$T/s1.err" || fail "suspend to RGW"
# the VM came from vm0: that set is the base (unchanged frames copied inside RGW)
grep -q "memory-ranges.zstd: [0-9]* of [0-9]* frames reused from the base" "$T/s1.err" ||
    fail "suspend did not use vm0 as base: $(cat "$T/s1.err")"
[ "$(head_code vm1/manifest.json)" = 200 ] || fail "no manifest in the bucket"
[ ! -e "$B/vms/golden/checkpoint" ] || fail "local checkpoint left after a successful suspend"
read -r r d <<<"$(last_counter "$B" golden)"
exec 7>"$T/caller-fd" # a descriptor of the caller's: QEMU must not inherit it
resume_check "$A" golden "$r" "$d" "s3://$BUCKET/vm1" || done_tests
exec 7>&-
[ "$(blob_md5 "$A" golden)" = "$boot_md5" ] || fail "RAM blob md5 after the RGW round trips"
# QEMU runs the guest: it gets neither the store credentials nor the caller's descriptors
qpid=$(cat "$A/vms/golden/pid")
[ -r "/proc/$qpid/environ" ] || fail "no QEMU process for the resumed VM (pid '$qpid')"
tr '\0' '\n' <"/proc/$qpid/environ" | grep -q '^AWS_' &&
    fail "QEMU's environment holds AWS_* variables: $(tr '\0' '\n' <"/proc/$qpid/environ" | grep -c '^AWS_')"
tr '\0' '\n' <"/proc/$qpid/environ" | grep -q '^PATH=' || fail "QEMU's environment lost PATH"
for f in /proc/"$qpid"/fd/*; do
    [ "$(readlink "$f")" = "$T/caller-fd" ] && fail "QEMU inherited the caller's descriptor $f"
done
# suspended again to the URL it came from: that set is the base of its own replacement
sleep 1
"$VMSNAP" -v vm suspend golden "s3://$BUCKET/vm1" --json --state-dir "$A" >"$T/s2.json" 2>"$T/s2.err" ||
    fail "suspend over its own base"
grep "memory-ranges.zstd: [0-9]* of [0-9]* frames reused from the base" "$T/s2.err" >&2 ||
    fail "suspend over its own base did not use it: $(cat "$T/s2.err")"
# copied_bytes: the bytes copied inside RGW from the set being replaced, as each file's push said
copied=$(copied_said "$T/s2.err")
[ "$(jget "$T/s2.json" "j['copied_bytes'] == $copied <= j['object_bytes']" 2>&1)" = True ] ||
    fail "suspend over its own base: copied_bytes is not the $copied bytes copied: $(cat "$T/s2.json")"
read -r r d <<<"$(last_counter "$A" golden)"
vmc "$B" stop --rm golden >/dev/null 2>&1 || true
resume_check "$B" golden "$r" "$d" "s3://$BUCKET/vm1" || done_tests
[ "$(blob_md5 "$B" golden)" = "$boot_md5" ] || fail "RAM blob md5 after a suspend over its own base"
[ "$(uploads_left)" = 0 ] || fail "uploads left in the bucket after the VM suspends"

# interrupted (SIGINT, a Ctrl-C) during its upload: the upload is aborted, nothing is stored,
# the checkpoint is kept locally and the VM resumes from it (the proxy delays the upload's parts
# and copies from the 2nd on, so the signal comes mid-way)
start_proxy "m2+:delay5000,c2+:delay5000"
sleep 1
AWS_ENDPOINT_URL=$PEP interrupt INT 2.5 "$VMSNAP" vm suspend golden "s3://$BUCKET/int" --state-dir "$B"
stop_proxy
[ "$irc" = 130 ] || fail "interrupted suspend: exit $irc ($(cat "$T/err"))"
grep -q "kept locally.*interrupted (SIGINT)" "$T/err" || fail "interrupted suspend: $(cat "$T/err")"
[ "$(head_code int/manifest.json)" = 404 ] || fail "the interrupted suspend stored a manifest"
OUT=$T/int.xml s3curl GET "$BUCKET/?prefix=int/" >/dev/null
grep -q '<Key>' "$T/int.xml" && fail "the interrupted suspend left objects: $(grep -o '<Key>[^<]*' "$T/int.xml")"
[ "$(uploads_left)" = 0 ] || fail "the interrupted suspend left an upload"
vmc "$B" ls | grep -Eq '^golden +paused .*checkpoint' || fail "ls after the interrupted suspend: $(vmc "$B" ls)"
read -r r d <<<"$(last_counter "$B" golden)"
resume_check "$B" golden "$r" "$d" || done_tests

# a suspend over a base holding the same frames: RGW copies them (UploadPartCopy), and
# copied_bytes counts them
suspend_same_base "$B" "s3://$BUCKET/same" "s3://$BUCKET/same-2" || done_tests
read -r r d <<<"$(last_counter "$B" golden)"
vmc "$A" stop --rm golden >/dev/null 2>&1 || true
resume_check "$A" golden "$r" "$d" "s3://$BUCKET/same-2" || done_tests
[ "$(uploads_left)" = 0 ] || fail "uploads left after the suspend over the same frames"
done_tests
