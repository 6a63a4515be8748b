#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# push/pull/ls/rm against a real Ceph RGW: part-size edges, byte-identical objects for -j1/-j8 and
# equal to the local store's, a 1 GiB sparse image, sets, wrong credentials, a killed push.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/lib.sh"
# This script is the contract of the reference layout (push --layout reference); the layered
# layout (the default) has its own, tests/integration/xfer_layers.sh.
export VMSNAP_LAYOUT=reference
. "$VMSNAP_SRC/tests/integration/xfer_s3_lib.sh"
M=$((1024 * 1024))

mk "$T/r" $((6 * M + 333))
"$VMSNAP" -q pack "$T/r" "$T/r.pk"
OS=$(stat -c %s "$T/r.pk")
# exactly one part (one PutObject), one part + 1 byte (two parts, the last of 1 byte), many parts
for ps in "$OS" $((OS - 1)) $((5 * M)); do
    for j in 1 8; do
        k=r-$ps-$j
        "$VMSNAP" -v -v push -j $j --part-size "$ps" "$T/r" "s3://$BUCKET/$k" 2>"$T/trace" ||
            fail "push part-size $ps -j $j: $(tail -3 "$T/trace")"
        if [ "$ps" = "$OS" ]; then
            grep -q 'uploads=' "$T/trace" && grep -q 'POST' "$T/trace" && fail "one-part object used a multipart upload"
        else
            grep -q 'POST .*uploads=' "$T/trace" || fail "part-size $ps: no multipart upload in trace"
        fi
        grep -q -- "$AWS_SECRET_ACCESS_KEY" "$T/trace" && fail "the secret appears in the -v trace"
        raw_get "$k" "$T/raw"
        cmp -s "$T/r.pk" "$T/raw" || fail "S3 object for part-size $ps -j $j differs from pack output"
        rm -f "$T/out"
        "$VMSNAP" -q pull -j $j "s3://$BUCKET/$k" "$T/out" || fail "pull part-size $ps -j $j"
        cmp -s "$T/r" "$T/out" || fail "round trip part-size $ps -j $j differs"
    done
done
# the same bytes as the local store
"$VMSNAP" -q push "$T/r" "$T/local-r" && cmp -s "$T/local-r" "$T/r.pk" || fail "local store object differs"

# sizes 0, 1 and a sparse 1 GiB image
: >"$T/z0"
printf x >"$T/z1"
truncate -s 1G "$T/sp"
dd if=/dev/urandom of="$T/sp" bs=1M count=2 seek=300 conv=notrunc status=none
for f in z0 z1 sp; do
    "$VMSNAP" -q push "$T/$f" "s3://$BUCKET/obj/$f" || fail "push $f"
    "$VMSNAP" -q pull "s3://$BUCKET/obj/$f" "$T/$f.out" || fail "pull $f"
    cmp -s "$T/$f" "$T/$f.out" || fail "round trip of $f differs"
done

# a snapshot set
mkdir "$T/set"
mk "$T/set/memory-ranges" $((12 * M))
echo '{"vcpus":2}' >"$T/set/state.json"
echo '{}' >"$T/set/config.json"
echo lineage-1 >"$T/set/base-id"
"$VMSNAP" -q push -j 8 --part-size 5M "$T/set" "s3://$BUCKET/sets/one" || fail "push set"
"$VMSNAP" -v -v pull -j 8 "s3://$BUCKET/sets/one" "$T/setout" 2>"$T/trace" || fail "pull set"
diff -r "$T/set" "$T/setout" >/dev/null || fail "set round trip differs"
# opening costs no HEAD: the manifest and each small file in one GET (its last 64 KiB, i.e. all
# of it), the 12 MiB image in two before its frames (tail with the seek table, then the head)
grep -q ' HEAD ' "$T/trace" && fail "pull of a set sent HEADs: $(grep ' HEAD ' "$T/trace")"
for f in manifest.json state.json.zstd config.json.zstd base-id.zstd; do
    [ "$(grep -c "GET $BUCKET/sets/one/$f ->" "$T/trace")" = 1 ] ||
        fail "pull of a set: $f took $(grep -c "GET $BUCKET/sets/one/$f ->" "$T/trace") GETs, not 1"
done
# an object longer than the manifest says is refused by its size, before any frame is fetched
OUT=$T/st.zstd s3curl GET "$BUCKET/sets/one/state.json.zstd" >/dev/null
printf 'junk' >>"$T/st.zstd"
[ "$(raw_put sets/one/state.json.zstd "$T/st.zstd")" = 200 ] ||
    fail "could not replace an object"
expect_fail "pull of a set with a grown object" "$VMSNAP" pull "s3://$BUCKET/sets/one" "$T/grown"
grep -q "state.json.zstd: $(stat -c %s "$T/st.zstd") bytes, the manifest says" "$T/err" ||
    fail "grown object: $(cat "$T/err")"
[ -e "$T/grown" ] && fail "a refused pull left $T/grown"
# an empty object (a suffix Range on it is unsatisfiable: HTTP 416) is an empty file's plain zstd
# as older writers of the reference system store it (no frame at all): it pulls as an empty file,
# as the reference reader reads it
: >"$T/empty"
[ "$(raw_put obj/empty "$T/empty")" = 200 ] ||
    fail "could not put an empty object"
"$VMSNAP" -q pull "s3://$BUCKET/obj/empty" "$T/empty.out" 2>"$T/err" || fail "pull of an empty object: $(cat "$T/err")"
[ -f "$T/empty.out" ] && [ ! -s "$T/empty.out" ] || fail "pull of an empty object: not an empty file"
"$VMSNAP" ls "s3://$BUCKET/sets" >"$T/ls" || fail "ls"
grep -q "s3://$BUCKET/sets/one" "$T/ls" && grep -q "4 files" "$T/ls" || fail "ls: $(cat "$T/ls")"
"$VMSNAP" rm "s3://$BUCKET/sets/one" || fail "rm"
# a set pushed over a single object at its key is refused, as the reverse is (pull would take
# the set and hide the object)
"$VMSNAP" -q push "$T/set/state.json" "s3://$BUCKET/shadow" || fail "push of the object to shadow"
expect_fail "push of a set over an object" "$VMSNAP" push "$T/set" "s3://$BUCKET/shadow"
grep -q "holds a single object" "$T/err" || fail "set over an object: $(cat "$T/err")"
[ "$(keys_under shadow)" = shadow ] || fail "set over an object left: $(keys_under shadow)"
"$VMSNAP" -q rm "s3://$BUCKET/shadow" || fail "rm shadow"
# a missing bucket is said as such by rm too (it said "no snapshot set here")
expect_fail "rm in a missing bucket" "$VMSNAP" rm "s3://nosuchbucket-$BUCKET/x"
grep -q "no such bucket" "$T/err" || fail "rm in a missing bucket: $(cat "$T/err")"
[ "$(head_code sets/one/manifest.json)" = 404 ] || fail "rm left the manifest"
[ "$(head_code sets/one/memory-ranges.zstd)" = 404 ] || fail "rm left an object"

# wrong secret: access denied naming the bucket, exit 4 (access denied), nothing written locally
rc=0
AWS_SECRET_ACCESS_KEY=not-the-secret "$VMSNAP" pull "s3://$BUCKET/obj/z1" "$T/denied" 2>"$T/err" || rc=$?
[ "$rc" = 4 ] || fail "wrong secret: exit $rc"
grep -q "access denied" "$T/err" && grep -q "$BUCKET" "$T/err" || fail "wrong secret: message: $(cat "$T/err")"
grep -q "not-the-secret" "$T/err" && fail "the secret appears in the error"
[ -e "$T/denied" ] && fail "wrong secret: a file was written"
ls -A "$T" | grep -q '^\.denied' && fail "wrong secret: a temporary file was left"
AWS_SECRET_ACCESS_KEY=not-the-secret expect_fail "push with a wrong secret" "$VMSNAP" push "$T/z1" "s3://$BUCKET/denied"
grep -q "access denied" "$T/err" || fail "push wrong secret: $(cat "$T/err")"

# a push killed mid-upload: no manifest, pull refuses, retried push + gc leave no upload behind
mkdir "$T/kset"
mk "$T/kset/memory-ranges" $((48 * M))
echo s >"$T/kset/state.json"
"$VMSNAP" -v -v push -j 1 --part-size 5M --max-memory 5M "$T/kset" "s3://$BUCKET/sets/k" 2>"$T/ktrace" &
pid=$!
wait_for 10 grep -q 'partNumber=2' "$T/ktrace" || fail "the push was not caught mid-upload"
kill_wait $pid
[ "$(uploads_left)" -ge 1 ] || fail "expected the killed push's upload to be pending"
keys_under sets/k/ | grep -q '^sets/k/vmsnap-push-[0-9a-f]\{32\}\.json$' || fail "the killed push left no mark: $(keys_under sets/k/)"
expect_fail "pull of a killed push" "$VMSNAP" pull "s3://$BUCKET/sets/k" "$T/kout"
"$VMSNAP" -q push "$T/kset" "s3://$BUCKET/sets/k" || fail "retried push"
[ "$(uploads_left)" = 0 ] || fail "unfinished uploads remain after the retried push"
"$VMSNAP" -q pull "s3://$BUCKET/sets/k" "$T/kout" || fail "pull after retried push"
diff -r "$T/kset" "$T/kout" >/dev/null || fail "retried push differs"
[ "$(keys_under sets/k/ | grep -c vmsnap-push-)" = 1 ] || fail "expected only the killed push's mark: $(keys_under sets/k/)"
# a killed push to a prefix nobody pushes to again: gc (old enough) removes its objects, its
# upload and its mark, and leaves the committed set beside it alone
"$VMSNAP" -v -v push -j 1 --part-size 5M --max-memory 5M "$T/kset" "s3://$BUCKET/sets/k2" 2>"$T/ktrace" &
pid=$!
caught() { grep -q 'partNumber=2' "$T/ktrace" && keys_under sets/k2/ | grep -q state.json.zstd; }
wait_for 10 caught || true
kill_wait $pid
keys_under sets/k2/ | grep -q '^sets/k2/state.json.zstd$' || fail "the push was not caught after storing an object: $(keys_under sets/k2/)"
"$VMSNAP" gc "s3://$BUCKET/sets" 2>"$T/gc.err" || fail "gc (young killed push): $(cat "$T/gc.err")"
keys_under sets/k2/ | grep -q '^sets/k2/state.json.zstd$' || fail "gc removed a young push's object"
"$VMSNAP" gc --older-than 0 "s3://$BUCKET/sets" 2>"$T/gc.err" || fail "gc (killed push): $(cat "$T/gc.err")"
grep -q 'aborted 1 unfinished upload, removed 2 marks of unfinished set pushes and 1 object they named' "$T/gc.err" || fail "gc (killed push): $(cat "$T/gc.err")"
[ -z "$(keys_under sets/k2/)" ] || fail "gc left the killed push's objects: $(keys_under sets/k2/)"
[ "$(uploads_left)" = 0 ] || fail "gc left the killed push's upload"
[ -z "$(keys_under sets/k/ | grep vmsnap-push-)" ] || fail "gc left the mark beside the committed set"
rm -rf "$T/kout" && "$VMSNAP" -q pull "s3://$BUCKET/sets/k" "$T/kout" || fail "pull after gc"
diff -r "$T/kset" "$T/kout" >/dev/null || fail "gc changed the committed set"
# a set pushed over a set of other names removes what only the old set had; killed right after
# its commit, its mark names that and gc removes it
mkdir -p "$T/oa" "$T/ob" && echo a1 >"$T/oa/a" && echo b1 >"$T/oa/b" && echo a2 >"$T/ob/a" && echo c2 >"$T/ob/c"
"$VMSNAP" -q push "$T/oa" "s3://$BUCKET/sets/rp" || fail "push ra"
"$VMSNAP" -q push "$T/ob" "s3://$BUCKET/sets/rp" || fail "push rb over ra"
[ "$(keys_under sets/rp/ | tr '\n' ' ')" = "sets/rp/a.zstd sets/rp/c.zstd sets/rp/manifest.json " ] ||
    fail "push over a set of other names left: $(keys_under sets/rp/)"
rc=0 && VMSNAP_FAILPOINT=push-committed "$VMSNAP" -q push "$T/oa" "s3://$BUCKET/sets/rp" 2>"$T/rerr" || rc=$?
[ $rc = 137 ] || fail "push killed after its commit: exit $rc: $(cat "$T/rerr")"
keys_under sets/rp/ | grep -q '^sets/rp/c.zstd$' || fail "the push was not killed before its clean-up: $(keys_under sets/rp/)"
"$VMSNAP" gc --older-than 0 "s3://$BUCKET/sets/rp" 2>"$T/gc.err" || fail "gc (killed after commit): $(cat "$T/gc.err")"
[ "$(keys_under sets/rp/ | tr '\n' ' ')" = "sets/rp/a.zstd sets/rp/b.zstd sets/rp/manifest.json " ] ||
    fail "gc after a push killed after its commit left: $(keys_under sets/rp/)"
rm -rf "$T/rout" && "$VMSNAP" -q pull "s3://$BUCKET/sets/rp" "$T/rout" && diff -r "$T/oa" "$T/rout" || fail "pull ra after gc"

# push with a base: unchanged 1 MiB frames are copied by RGW (UploadPartCopy, guarded by the
# base's ETag); runs under 5 MiB are fetched. RGW enforces the 5 MiB part minimum on complete.
mk "$T/v1" $((48 * M))
cp "$T/v1" "$T/v2"
for mib in 2 20 21 40; do
    dd if=/dev/urandom of="$T/v2" bs=1M count=1 seek=$mib conv=notrunc status=none
done
"$VMSNAP" -q pack --frame-size 1M "$T/v2" "$T/v2.pk"
"$VMSNAP" -q push --frame-size 1M "$T/v1" "s3://$BUCKET/b/v1" || fail "push base"
"$VMSNAP" -v -v push --frame-size 1M --base "s3://$BUCKET/b/v1" "$T/v2" "s3://$BUCKET/b/v2" 2>"$T/trace" ||
    fail "push with a base: $(tail -3 "$T/trace")"
grep -q "= copy of $BUCKET/b/v1 bytes=" "$T/trace" || fail "no UploadPartCopy in the trace"
grep -q "copied by the store from the base" "$T/trace" || fail "push with a base reports no copies"
grep -q -- "$AWS_SECRET_ACCESS_KEY" "$T/trace" && fail "the secret appears in the base push trace"
raw_get b/v2 "$T/raw"
cmp -s "$T/raw" "$T/v2.pk" || fail "object pushed with a base differs from pack output"
[ "$(uploads_left)" = 0 ] || fail "uploads left after a push with a base"
"$VMSNAP" -q rm "s3://$BUCKET/b/v1" || fail "rm base"
"$VMSNAP" -q pull "s3://$BUCKET/b/v2" "$T/v2.out" && cmp -s "$T/v2" "$T/v2.out" ||
    fail "round trip of an object pushed with a base (base deleted) differs"
# a set pushed over its own base, as a VM suspended again to the URL it came from
mkdir "$T/bs1" "$T/bs2"
cp "$T/v1" "$T/bs1/memory-ranges" && echo one >"$T/bs1/state"
cp "$T/v2" "$T/bs2/memory-ranges" && echo two >"$T/bs2/state"
"$VMSNAP" -q push --frame-size 1M "$T/bs1" "s3://$BUCKET/b/s" || fail "push set"
"$VMSNAP" push --frame-size 1M --base "s3://$BUCKET/b/s" "$T/bs2" "s3://$BUCKET/b/s" 2>"$T/log" ||
    fail "push a set over its own base: $(cat "$T/log")"
grep -q "copied by the store" "$T/log" || fail "set over its own base: no copies"
"$VMSNAP" -q pull "s3://$BUCKET/b/s" "$T/bs.out" && diff -r "$T/bs2" "$T/bs.out" >/dev/null ||
    fail "set pushed over its own base differs"
[ "$(uploads_left)" = 0 ] || fail "uploads left after the set pushes"
"$VMSNAP" -q rm "s3://$BUCKET/b/s" && "$VMSNAP" -q rm "s3://$BUCKET/b/v2" || fail "rm base objects"

# two pushes of different sets to one prefix at the same time (two nodes suspending one
# sandbox): a push that reports success stored its set, whole; the other reports that its
# snapshot is not stored (the manifest carries a push id; each push reads its set back)
mkdir "$T/ra" "$T/rb"
mk "$T/ra/memory-ranges" $((24 * M)) && mk "$T/rb/memory-ranges" $((24 * M))
echo '{"a":1}' >"$T/ra/state.json" && echo '{"b":2}' >"$T/rb/state.json"
echo A >"$T/ra/base-id" && echo B >"$T/rb/base-id"
ok_rounds=0
for round in 1 2 3 4; do
    "$VMSNAP" -q push -j 2 --part-size 5M "$T/ra" "s3://$BUCKET/race" 2>"$T/era" &
    pa=$!
    "$VMSNAP" -q push -j 2 --part-size 5M "$T/rb" "s3://$BUCKET/race" 2>"$T/erb" &
    pb=$!
    ra=0 && wait $pa || ra=$?
    rb=0 && wait $pb || rb=$?
    for w in a b; do
        # how a push loses: its check, its upload aborted by the other, or RGW refusing a
        # second completion of the same key at the same time
        [ "$(eval echo \$r$w)" = 0 ] ||
            grep -q "NOT stored there\|no such multipart upload\|completion is already in progress" "$T/er$w" ||
            fail "race round $round: push $w failed unclearly: $(cat "$T/er$w")"
    done
    [ "$ra" = 0 ] || [ "$rb" = 0 ] || continue
    rm -rf "$T/race.out"
    "$VMSNAP" -q pull "s3://$BUCKET/race" "$T/race.out" 2>"$T/err" ||
        fail "race round $round: a push succeeded (a=$ra b=$rb) but the set does not pull: $(cat "$T/err")"
    is=none
    diff -r "$T/ra" "$T/race.out" >/dev/null && is=a
    diff -r "$T/rb" "$T/race.out" >/dev/null && is=b
    # the set is one that reported success (both may have: the later replaced the earlier)
    [ "$is" != none ] && [ "$(eval echo \$r$is)" = 0 ] ||
        fail "race round $round: a=$ra b=$rb but the stored set is $is"
    ok_rounds=$((ok_rounds + 1))
done
echo "race: $ok_rounds of 4 rounds had a push succeed" >&2
[ "$(uploads_left)" = 0 ] || fail "uploads left after the racing pushes"
"$VMSNAP" -q rm "s3://$BUCKET/race" 2>/dev/null || true

# gc of a prefix aborts uploads of that key and under "key/", not of "key0/..." next to it
[ "$(uploads_left)" = 0 ] || fail "uploads left before the gc boundary case"
[ "$(s3curl POST "$BUCKET/vm10/x.zstd?uploads=")" = 200 ] || fail "start an upload under vm10/"
"$VMSNAP" -q gc --older-than 0 "s3://$BUCKET/vm1" || fail "gc vm1"
[ "$(uploads_left)" = 1 ] || fail "gc s3://$BUCKET/vm1 aborted the upload under vm10/"
# gc leaves an upload younger than --older-than (default 1h) alone: it may be a push running
# now; --dry-run says what it would do and does nothing; the age is the server's Initiated
"$VMSNAP" gc "s3://$BUCKET/vm10" 2>"$T/gc.err" || fail "gc vm10 (young upload)"
grep -q 'aborted 0 unfinished uploads; kept 1 younger than 1h' "$T/gc.err" ||
    fail "gc did not say it kept the young upload: $(cat "$T/gc.err")"
[ "$(uploads_left)" = 1 ] || fail "gc (default age) aborted an upload started just now"
sleep 2.2
"$VMSNAP" gc --dry-run --older-than 2s "s3://$BUCKET/vm10" >"$T/gc.out" 2>"$T/gc.err" ||
    fail "gc --dry-run"
grep -q "^would abort	upload	[0-9]* s old	s3://$BUCKET/vm10/x.zstd\$" "$T/gc.out" || fail "gc --dry-run listing: $(cat "$T/gc.out")"
[ "$(uploads_left)" = 1 ] || fail "gc --dry-run aborted an upload"
"$VMSNAP" gc --dry-run --older-than 1h "s3://$BUCKET/vm10" >"$T/gc.out" 2>/dev/null
grep -q "^keep	upload	[0-9]* s old	s3://$BUCKET/vm10/x.zstd\$" "$T/gc.out" || fail "gc --dry-run keep listing: $(cat "$T/gc.out")"
rc=0; "$VMSNAP" gc --older-than 5y "s3://$BUCKET/vm10" 2>"$T/err" || rc=$?
[ $rc = 2 ] && grep -q 'duration like' "$T/err" || fail "gc --older-than 5y: exit $rc, $(cat "$T/err")"
"$VMSNAP" -q gc --older-than 2s "s3://$BUCKET/vm10" || fail "gc vm10"
[ "$(uploads_left)" = 0 ] || fail "gc --older-than 2s s3://$BUCKET/vm10 left its 2 s old upload"
# an upload that began long ago but stored a part just now is a push still running: its age is
# its newest part's (ListParts), not its Initiated time
OUT=$T/mpu.xml s3curl POST "$BUCKET/vm11/y.zstd?uploads=" >/dev/null
uid=$(sed -n 's/.*<UploadId>\([^<]*\)<\/UploadId>.*/\1/p' "$T/mpu.xml")
[ -n "$uid" ] || fail "start an upload under vm11/: $(cat "$T/mpu.xml")"
sleep 2.2
head -c 1000 /dev/urandom >"$T/part1"
[ "$(raw_put "vm11/y.zstd?partNumber=1&uploadId=$uid" "$T/part1")" = 200 ] || fail "upload a part under vm11/"
"$VMSNAP" gc --dry-run --older-than 2s "s3://$BUCKET/vm11" >"$T/gc.out" 2>/dev/null
grep -q "^keep	upload	[01] s old	s3://$BUCKET/vm11/y.zstd\$" "$T/gc.out" || fail "gc aged a running upload by its start: $(cat "$T/gc.out")"
"$VMSNAP" -q gc --older-than 2s "s3://$BUCKET/vm11" || fail "gc vm11"
[ "$(uploads_left)" = 1 ] || fail "gc aborted an upload whose newest part is fresh"
sleep 2.2
"$VMSNAP" -q gc --older-than 2s "s3://$BUCKET/vm11" || fail "gc vm11 (idle)"
[ "$(uploads_left)" = 0 ] || fail "gc left an upload idle for 2 s"

# a file name of 249 bytes (its temporary on pull cannot be ".NAME.XXXXXX": 257 bytes)
mkdir "$T/lset" && long=$(printf 'a%.0s' $(seq 1 249)) && echo hi >"$T/lset/$long"
"$VMSNAP" -q push "$T/lset" "s3://$BUCKET/lset" || fail "push of a set with a 249-byte name"
"$VMSNAP" -q pull "s3://$BUCKET/lset" "$T/lset.out" || fail "pull of a set with a 249-byte name"
diff -r "$T/lset" "$T/lset.out" >/dev/null || fail "249-byte name: round trip differs"
"$VMSNAP" -q rm "s3://$BUCKET/lset" || fail "rm lset"

# a set of more files than the soft descriptor limit, pulled over many connections: the raised
# limit counts the connections' descriptors too
mkdir "$T/many" && for i in $(seq 1 1000); do echo "$i" >"$T/many/f$i"; done
"$VMSNAP" -q push -j 16 "$T/many" "s3://$BUCKET/many" || fail "push of a 1000-file set"
if [ "$(ulimit -Hn)" = unlimited ] || [ "$(ulimit -Hn)" -ge 1300 ]; then
    (ulimit -Sn 1024 && "$VMSNAP" -q pull -j 32 "s3://$BUCKET/many" "$T/many.out") 2>"$T/err" ||
        fail "pull -j 32 of a 1000-file set under ulimit -n 1024: $(tail -2 "$T/err")"
    diff -r "$T/many" "$T/many.out" >/dev/null || fail "1000-file set round trip differs"
fi
"$VMSNAP" -q rm "s3://$BUCKET/many" || fail "rm many"

# clean the bucket
"$VMSNAP" -q rm "s3://$BUCKET/sets/k" || fail "rm k"
done_tests
