#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Faults between vmsnap and RGW through tests/faultproxy.c: 503s, resets and delays on chosen
# requests are retried and the result is byte-identical; a server that goes away mid-push or
# mid-pull gives an error after bounded retries with no object, upload or file left behind.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/lib.sh"
# This script is the contract of the reference layout (push --layout reference); the layered
# layout (the default) has its own, tests/integration/xfer_layers.sh.
export VMSNAP_LAYOUT=reference
. "$VMSNAP_SRC/tests/integration/xfer_s3_lib.sh"
M=$((1024 * 1024))
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

# ... and mid-way through a layered set's push: its clean-up gives up at the first object it
# cannot remove (it tried every object in turn, each with all its retries: minutes against a
# dead or stalled store after a Ctrl-C), says how many it left, and gc removes them later
mkdir -p "$T/gset" && for f in a b c d; do head -c 200000 /dev/urandom >"$T/gset/$f"; done
start_proxy "7+:reset"
: >"$T/proxy.log"
VMSNAP_S3_ATTEMPTS=3 expect_fail "set push with the server gone" \
    "$VMSNAP" push -j 1 --layout layered --endpoint "$PEP" "$T/gset" "s3://$BUCKET/gset"
grep -q "objects of this push could not be removed ('vmsnap gc'" "$T/err" ||
    fail "set push with the server gone: what it left is not said: $(cat "$T/err")"
# (one object's 3 attempts; libcurl may send one of them again on a fresh connection)
ndel=$(grep '^faultproxy: #[0-9]* DELETE ' "$T/proxy.log" | awk '{print $4}' | sort -u | wc -l)
[ "$ndel" = 1 ] || fail "the clean-up tried $ndel objects: $(grep DELETE "$T/proxy.log")"
[ -n "$(keys_under gset/)" ] || fail "the test did not leave objects behind"
"$VMSNAP" -q gc --older-than 0 "s3://$BUCKET/gset" || fail "gc after the failed set push"
[ -z "$(keys_under gset/)" ] || fail "gc left the failed push's objects: $(keys_under gset/)"

# an endpoint where nothing listens: the error names it (only the bucket and key were named, and
# a mistyped AWS_ENDPOINT_URL looked like a store problem)
stop_proxy
dead=$(cat "$T/port") # (the proxy's port, free again)
# (--retries 1: two attempts, whatever VMSNAP_S3_ATTEMPTS says: the environment won over it)
VMSNAP_S3_ATTEMPTS=5 expect_fail "pull from an endpoint nobody listens on" \
    "$VMSNAP" -v pull --retries 1 --endpoint "http://127.0.0.1:$dead" "s3://$BUCKET/f" "$T/nobody"
grep -q "Couldn't connect to server (endpoint http://127.0.0.1:$dead)" "$T/err" ||
    fail "unreachable endpoint not named: $(cat "$T/err")"
grep -q "gave up after 2 attempts" "$T/err" || fail "--retries 1 beside VMSNAP_S3_ATTEMPTS=5: $(cat "$T/err")"
# ... and rm there does not suggest --force, which does not help a store that does not answer
VMSNAP_S3_ATTEMPTS=1 expect_fail "rm at an endpoint nobody listens on" \
    "$VMSNAP" rm --endpoint "http://127.0.0.1:$dead" "s3://$BUCKET/f"
grep -q "cannot read the manifest: .*Couldn't connect" "$T/err" && ! grep -q -- "--force" "$T/err" ||
    fail "rm with the store unreachable: $(cat "$T/err")"

# ... and mid-pull: from the 4th request on
start_proxy "4+:reset"
VMSNAP_S3_ATTEMPTS=3 expect_fail "pull with the server gone" \
    "$VMSNAP" pull -j 2 --endpoint "$PEP" "s3://$BUCKET/f" "$T/gone"
grep -q "gave up after 3 attempts" "$T/err" || fail "pull: not a bounded-retry error: $(cat "$T/err")"
[ -e "$T/gone" ] && fail "a file was left at the destination"
ls -A "$T" | grep -q '^\.gone' && fail "a temporary file was left"

# a server that ignores Range (answers the first GET, the object's tail, with all 17 MiB): a clear
# error naming the object, nothing at the destination
start_proxy "1+:norange"
expect_fail "pull from a server without ranges" \
    "$VMSNAP" pull -j 2 --endpoint "$PEP" "s3://$BUCKET/f" "$T/norange"
grep -q "ignored the Range header.*including suffix ranges" "$T/err" ||
    fail "no range support: message: $(cat "$T/err")"
grep -q " -> no range" "$T/proxy.log" ||
    fail "the norange rule did not hit"
[ -e "$T/norange" ] && fail "a file was left at the destination"
ls -A "$T" | grep -q '^\.norange' && fail "a temporary file was left"

# a base that changes during the push: the first UploadPartCopy is answered 412 (the ETag guard);
# the file goes again without the base and the object is still right
head -c $((24 * M)) /dev/urandom >"$T/b1"
cp "$T/b1" "$T/b2"
dd if=/dev/urandom of="$T/b2" bs=1M count=1 seek=1 conv=notrunc status=none
"$VMSNAP" -q pack --frame-size 1M "$T/b2" "$T/b2.pk"
"$VMSNAP" -q push --frame-size 1M "$T/b1" "s3://$BUCKET/base" || fail "push base"
stop_proxy
start_proxy "c1:412"
"$VMSNAP" -v push --frame-size 1M --base "s3://$BUCKET/base" --endpoint "$PEP" "$T/b2" \
    "s3://$BUCKET/nb" 2>"$T/log" || fail "push with a base that changed: $(tail -3 "$T/log")"
grep -q "pushing it whole" "$T/log" || fail "the 412 on a copy did not hit: $(tail -3 "$T/log")"
grep -q "copied by the store" "$T/log" && fail "a push that fell back reports copies"
raw_get nb "$T/raw"
cmp -s "$T/raw" "$T/b2.pk" || fail "object pushed after the base changed differs"
[ "$(uploads_left)" = 0 ] || fail "uploads left after the fallback"
# a store that cannot copy (every UploadPartCopy reset): the file goes again without the base
start_proxy "c1+:reset"
VMSNAP_S3_ATTEMPTS=2 "$VMSNAP" -v push --frame-size 1M --base "s3://$BUCKET/base" --endpoint "$PEP" \
    "$T/b2" "s3://$BUCKET/nc" 2>"$T/log" || fail "push when copies fail: $(tail -3 "$T/log")"
grep -q "pushing it whole" "$T/log" || fail "copy resets did not hit: $(tail -3 "$T/log")"
raw_get nc "$T/raw"
cmp -s "$T/raw" "$T/b2.pk" || fail "object pushed after failed copies differs"
[ "$(uploads_left)" = 0 ] || fail "uploads left after the copies failed"
# the server gone altogether (every part and copy from the first on): bounded error, nothing
# visible, no upload left, after the attempt without the base too
start_proxy "m1+:reset"
VMSNAP_S3_ATTEMPTS=2 expect_fail "push with a base, the server gone" \
    "$VMSNAP" push --frame-size 1M --base "s3://$BUCKET/base" --endpoint "$PEP" "$T/b2" "s3://$BUCKET/gone2"
grep -q "gave up after 2 attempts" "$T/err" || fail "base push, server gone: not a bounded-retry error: $(cat "$T/err")"
[ "$(head_code gone2)" = 404 ] || fail "an object is visible after the failed push with a base"
[ "$(uploads_left)" = 0 ] || fail "the failed push with a base left its multipart upload"

# interrupted (SIGINT, as a Ctrl-C; SIGTERM, as a supervisor): a push stops at its next part (those in flight aborted),
# aborts its multipart upload and leaves no object; a pull leaves no file and no temporary; both
# exit 1 saying so. The delays keep each mid-way when the signal comes.
start_proxy "m3+:delay5000"
interrupt INT 1.5 "$VMSNAP" push -j 2 --part-size 5M --endpoint "$PEP" "$T/r" "s3://$BUCKET/int"
[ "$irc" = 130 ] || fail "interrupted push: exit $irc ($(cat "$T/err"))"
grep -q "interrupted (SIGINT)" "$T/err" || fail "interrupted push: message: $(cat "$T/err")"
[ "$(head_code int)" = 404 ] || fail "an object is visible after the interrupted push"
[ "$(uploads_left)" = 0 ] || fail "the interrupted push left its multipart upload"
start_proxy "3+:delay5000"
interrupt TERM 1.5 "$VMSNAP" pull -j 2 --endpoint "$PEP" "s3://$BUCKET/f" "$T/pint"
[ "$irc" = 143 ] || fail "interrupted pull: exit $irc ($(cat "$T/err"))"
grep -q "interrupted (SIGTERM)" "$T/err" || fail "interrupted pull: message: $(cat "$T/err")"
[ -e "$T/pint" ] && fail "the interrupted pull left its destination"
ls -A "$T" | grep -q '^\.pint' && fail "the interrupted pull left a temporary file"
# every answer to the commit (the PUT of manifest.json) is lost, though the server stored it:
# the push finds its own manifest there and succeeds (it said 'another push is or was there
# meanwhile', exit 1, over a set that was committed and whole)
mkdir -p "$T/cm" && head -c $((2 * M)) /dev/urandom >"$T/cm/memory-ranges" && echo s >"$T/cm/state"
start_proxy "M1+:drop"
VMSNAP_S3_ATTEMPTS=2 "$VMSNAP" push --endpoint "$PEP" "$T/cm" "s3://$BUCKET/cm" 2>"$T/err" ||
    fail "push whose commit answers were lost: $(cat "$T/err")"
grep -q "manifest.json HTTP/1.1 -> answer dropped" "$T/proxy.log" || fail "the commit's answer was not dropped"
grep -q "the commit's answer was lost, but the manifest there is this push's" "$T/err" ||
    fail "commit answer lost: $(cat "$T/err")"
stop_proxy
rm -rf "$T/cm.out" && "$VMSNAP" -q pull "s3://$BUCKET/cm" "$T/cm.out" && diff -r "$T/cm" "$T/cm.out" >/dev/null ||
    fail "the set whose commit answer was lost does not pull back"
[ -z "$(keys_under cm/ | grep vmsnap-push)" ] || fail "commit answer lost: the push mark stayed: $(keys_under cm/)"
"$VMSNAP" -q rm "s3://$BUCKET/cm" || fail "rm cm"

# a push over a set interrupted while uploading (before it stored over any of that set's
# objects) leaves the set as it was: the same manifest, the same objects, no upload left (it
# un-commits the set only once every object is uploaded)
head -c $((2 * M)) /dev/urandom >"$T/cm/memory-ranges" && echo s1 >"$T/cm/state"
"$VMSNAP" -q push "$T/cm" "s3://$BUCKET/ov" || fail "push of the set to replace"
raw_get ov/manifest.json "$T/ov.manifest"
mkdir -p "$T/cm2" && head -c $((17 * M)) /dev/urandom >"$T/cm2/memory-ranges" && echo s2 >"$T/cm2/state" &&
    echo n >"$T/cm2/new"
start_proxy "m3+:delay5000"
interrupt INT 1.5 "$VMSNAP" push -j 2 --part-size 5M --endpoint "$PEP" "$T/cm2" "s3://$BUCKET/ov"
stop_proxy
[ "$irc" = 130 ] || fail "interrupted push over a set: exit $irc ($(cat "$T/err"))"
raw_get ov/manifest.json "$T/ov.manifest2"
cmp -s "$T/ov.manifest" "$T/ov.manifest2" || fail "the interrupted push changed the old manifest: $(cat "$T/err")"
rm -rf "$T/ov.out" && "$VMSNAP" -q pull "s3://$BUCKET/ov" "$T/ov.out" && diff -r "$T/cm" "$T/ov.out" >/dev/null ||
    fail "the set an interrupted push was replacing does not pull back whole"
[ "$(keys_under ov/ | tr '\n' ' ')" = "ov/manifest.json ov/memory-ranges.zstd ov/state.zstd " ] ||
    fail "the interrupted push over a set left: $(keys_under ov/)"
[ "$(uploads_left)" = 0 ] || fail "the interrupted push over a set left uploads"
"$VMSNAP" -q rm "s3://$BUCKET/ov" || fail "rm ov"

# the store gone while a push over a set uploads (the proxy killed at its 2nd part): the push
# fails, and the set it was replacing is still there, whole, for every other node to resume;
# gc later keeps it. It used to un-commit the set first: with the store gone it could not put
# the manifest back, and gc, taking the set's objects for the failed push's, deleted them.
"$VMSNAP" -q push "$T/cm" "s3://$BUCKET/og" || fail "push of the set the store loses mid-push"
raw_get og/manifest.json "$T/og.manifest"
: >"$T/proxy.log" # (earlier pushes' part requests are in it)
start_proxy "m2+:delay4000"
VMSNAP_S3_ATTEMPTS=2 "$VMSNAP" -v push -j 2 --part-size 5M --endpoint "$PEP" "$T/cm2" "s3://$BUCKET/og" 2>"$T/err" &
opid=$!
wait_for 10 grep -q 'partNumber=2' "$T/proxy.log" ||
    fail "the push over og did not reach its 2nd part: $(cat "$T/err")"
stop_proxy
rc=0 && wait $opid || rc=$?
[ "$rc" = 5 ] || fail "push with the store gone mid-upload: exit $rc: $(cat "$T/err")"
# (its clean-up's listings are retried too, each line saying why: they said "()")
grep -q "s3: retry .*GET .*Couldn't connect to server (endpoint" "$T/err" ||
    fail "no retry of the clean-up's requests logged with its reason: $(grep 's3: retry' "$T/err")"
grep "s3: retry" "$T/err" | grep -q '()$' && fail "a retry line without its reason: $(grep 's3: retry' "$T/err")"
raw_get og/manifest.json "$T/og.manifest2"
cmp -s "$T/og.manifest" "$T/og.manifest2" || fail "the store gone mid-push: the set it replaced lost its manifest: $(cat "$T/err")"
"$VMSNAP" -q gc --older-than 0 "s3://$BUCKET/og" 2>"$T/gc" || fail "gc after the store came back: $(cat "$T/gc")"
rm -rf "$T/og.out" && "$VMSNAP" -q pull "s3://$BUCKET/og" "$T/og.out" && diff -r "$T/cm" "$T/og.out" >/dev/null ||
    fail "the set a push was replacing when the store went away does not pull whole after gc"
[ "$(keys_under og/ | tr '\n' ' ')" = "og/manifest.json og/memory-ranges.zstd og/state.zstd " ] ||
    fail "the push the store lost mid-upload, then gc, left: $(keys_under og/)"
"$VMSNAP" -q rm "s3://$BUCKET/og" || fail "rm og"

# every answer to the un-commit (the DELETE of the old manifest) is lost, though the server
# carried it out: the push sees the manifest gone, so the un-commit is done, and commits its set
# (it put the old one back and failed)
mkdir -p "$T/uc" && head -c $((2 * M)) /dev/urandom >"$T/uc/memory-ranges" && echo u1 >"$T/uc/state"
"$VMSNAP" -q push "$T/uc" "s3://$BUCKET/uc" || fail "push of the set for the un-commit case"
mkdir -p "$T/uc2" && echo u2 >"$T/uc2/state"
start_proxy "U1+:drop"
VMSNAP_S3_ATTEMPTS=2 "$VMSNAP" -v push --endpoint "$PEP" "$T/uc2" "s3://$BUCKET/uc" 2>"$T/err" ||
    fail "push whose un-commit answers were lost: $(cat "$T/err")"
stop_proxy
grep -q "manifest.json HTTP/1.1 -> answer dropped" "$T/proxy.log" || fail "the un-commit's answer was not dropped"
grep -q "the un-commit was carried out, though its answer was an error" "$T/err" ||
    fail "un-commit answer lost: $(cat "$T/err")"
rm -rf "$T/uc.out" && "$VMSNAP" -q pull "s3://$BUCKET/uc" "$T/uc.out" && diff -r "$T/uc2" "$T/uc.out" >/dev/null ||
    fail "the set whose un-commit answer was lost is not the new one"
# a 503 on the un-commit (not carried out) is tried again, the set there checked first: the push
# commits its set (one 503 failed the whole push), with nothing left for gc
"$VMSNAP" -q push "$T/uc" "s3://$BUCKET/uc" || fail "push of the set for the un-commit 503 case"
start_proxy "U1:503"
"$VMSNAP" -v push --endpoint "$PEP" "$T/uc2" "s3://$BUCKET/uc" 2>"$T/err" ||
    fail "push whose un-commit got a 503: $(cat "$T/err")"
stop_proxy
grep -q "retry 1 of the un-commit" "$T/err" || fail "un-commit 503 not retried: $(cat "$T/err")"
rm -rf "$T/uc.out" && "$VMSNAP" -q pull "s3://$BUCKET/uc" "$T/uc.out" && diff -r "$T/uc2" "$T/uc.out" >/dev/null ||
    fail "the set whose un-commit got a 503 is not the new one"
[ "$(keys_under uc/ | tr '\n' ' ')" = "uc/manifest.json uc/state.zstd " ] ||
    fail "the push whose un-commit got a 503 left: $(keys_under uc/)"
# a 503 on the delete of a replaced object (a name the new set does not have) is tried again:
# nothing is left for gc (the object and the push's mark stayed)
"$VMSNAP" -q push "$T/uc" "s3://$BUCKET/uc" || fail "push of the set for the replaced-object case"
start_proxy "D1:503"
"$VMSNAP" -v push --endpoint "$PEP" "$T/uc2" "s3://$BUCKET/uc" 2>"$T/err" ||
    fail "push whose replaced object's delete got a 503: $(cat "$T/err")"
stop_proxy
grep -q "retry 1 of the delete of memory-ranges.zstd" "$T/err" || fail "replaced object's delete not retried: $(cat "$T/err")"
[ "$(keys_under uc/ | tr '\n' ' ')" = "uc/manifest.json uc/state.zstd " ] ||
    fail "the push whose replaced object's delete got a 503 left: $(keys_under uc/)"

# Ctrl-C once the completions of the old set's names are asked for: they go out (a completion
# cut short left the old objects half replaced and both sets lost) and the push commits its set;
# Ctrl-C just before them: none goes out and the old set is put back
mkdir -p "$T/cc" && head -c $((6 * M)) /dev/urandom >"$T/cc/memory-ranges" && echo c2 >"$T/cc/state"
for fp in push-completion push-completing; do
    VMSNAP_FAILPOINT=$fp:stop env --default-signal=INT "$VMSNAP" push "$T/cc" "s3://$BUCKET/uc" 2>"$T/err" &
    cpid=$!
    wait_stopped $cpid 30 || fail "the push did not stop at $fp"
    kill -INT $cpid && kill -CONT $cpid
    rc=0 && wait $cpid || rc=$?
    rm -rf "$T/cc.out" && "$VMSNAP" -q pull "s3://$BUCKET/uc" "$T/cc.out" || fail "$fp: no set after Ctrl-C: $(cat "$T/err")"
    if [ $fp = push-completion ]; then
        [ $rc = 0 ] && diff -r "$T/cc" "$T/cc.out" >/dev/null || fail "Ctrl-C during the completions: exit $rc: $(cat "$T/err")"
        echo u3 >"$T/cc/state" # the next round replaces this set
        cp -a "$T/cc.out" "$T/cc.before"
    else
        [ $rc = 130 ] && diff -r "$T/cc.before" "$T/cc.out" >/dev/null ||
            fail "Ctrl-C before the completions: exit $rc, old set not back: $(cat "$T/err")"
    fi
done
[ "$(uploads_left)" = 0 ] || fail "Ctrl-C around the completions left uploads"

# the answer to a completion is lost, the server carried it out: its retry finds no such upload,
# and the object there is this push's (its digest): completed, the push commits (it took the
# answer for "aborted meanwhile" and removed both sets)
# (one name in common, so one completion: its retry is request K2)
"$VMSNAP" -q rm "s3://$BUCKET/uc" || fail "rm uc"
mkdir -p "$T/k1" "$T/k2" && head -c $((2 * M)) /dev/urandom >"$T/k1/memory-ranges" &&
    head -c $((6 * M)) /dev/urandom >"$T/k2/memory-ranges" && echo k2 >"$T/k2/state"
"$VMSNAP" -q push "$T/k1" "s3://$BUCKET/uc" || fail "push of the set for the lost completion"
start_proxy "K1:drop,K2:nsu" # the retry: 'no such upload', as S3 may answer once it completed
"$VMSNAP" push --endpoint "$PEP" "$T/k2" "s3://$BUCKET/uc" 2>"$T/err" || fail "push whose completion answer was lost: $(cat "$T/err")"
stop_proxy
grep -q "uploadId=.* -> answer dropped" "$T/proxy.log" && grep -q "uploadId=.* -> 404 NoSuchUpload" "$T/proxy.log" ||
    fail "the completion's answer was not dropped and its retry not refused"
rm -rf "$T/cc.out" && "$VMSNAP" -q pull "s3://$BUCKET/uc" "$T/cc.out" && diff -r "$T/k2" "$T/cc.out" >/dev/null ||
    fail "the set whose completion answer was lost does not pull back"
"$VMSNAP" -q rm "s3://$BUCKET/uc" || fail "rm uc"

# every completion fails (503s to the end of its retries; RGW answers the completion of an
# aborted upload with a 500 as well) and the key still holds the old set's object: nothing was
# stored over, the old set is put back (only 'no such upload' counted: both sets were removed)
"$VMSNAP" -q push "$T/k1" "s3://$BUCKET/kc" || fail "push of the set for the failed completion"
start_proxy "K1+:503"
VMSNAP_S3_ATTEMPTS=2 expect_fail "push whose completions all fail" \
    "$VMSNAP" push --endpoint "$PEP" "$T/k2" "s3://$BUCKET/kc"
stop_proxy
grep -q "the set this push was replacing is in place again" "$T/err" || fail "completions failing: $(cat "$T/err")"
rm -rf "$T/kc.out" && "$VMSNAP" -q pull "s3://$BUCKET/kc" "$T/kc.out" && diff -r "$T/k1" "$T/kc.out" >/dev/null ||
    fail "the set whose replacing push's completions failed was not put back"
[ "$(uploads_left)" = 0 ] || fail "failed completions left uploads"
"$VMSNAP" -q rm "s3://$BUCKET/kc" || fail "rm kc"

stop_proxy
for k in f base nb nc; do OUT=/dev/null s3curl DELETE "$BUCKET/$k" >/dev/null; done
done_tests
