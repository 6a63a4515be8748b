#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# push/pull/ls/rm through the local store: round trips at the part-size edges, snapshot sets,
# byte-identical objects for any -j / part size and equal to `vmsnap pack`, refusal of incomplete
# and hostile sets, a killed push, and a full disk on pull.
. "$VMSNAP_SRC/tests/lib.sh"
S=$T/store
mkdir -p "$S"

# random, incompressible data so object sizes are predictable (about the input size)
mk() { head -c "$2" /dev/urandom >"$1"; }

mk "$T/r12" $((3 * 1024 * 1024 + 77))
"$VMSNAP" -q pack "$T/r12" "$T/r12.pk"
OS=$(stat -c %s "$T/r12.pk")
# exactly one part (a single put), one part + 1 byte, many parts with a partial last part
for ps in "$OS" $((OS - 1)) 65536 1000000; do
    for j in 1 8; do
        "$VMSNAP" -q -v -v push -j $j --part-size "$ps" --max-memory 4M "$T/r12" "$S/r12-$ps-$j" 2>"$T/trace" ||
            fail "push part-size $ps -j $j"
        cmp -s "$T/r12.pk" "$S/r12-$ps-$j" || fail "object for part-size $ps -j $j differs from pack output"
        rm -f "$T/out"
        "$VMSNAP" -q pull -j $j "$S/r12-$ps-$j" "$T/out" || fail "pull part-size $ps -j $j"
        cmp -s "$T/r12" "$T/out" || fail "round trip part-size $ps -j $j differs"
        [ "$(stat -c %a "$T/out")" = 600 ] || fail "pulled file mode $(stat -c %a "$T/out"), want 600"
        [ "$(stat -c %a "$S/r12-$ps-$j")" = 600 ] || fail "stored object mode not 600"
    done
done
ls -A "$S" | grep -q '^\.' && fail "temporary files left in the store: $(ls -A "$S")"

# page cache: a stored object is dropped once written, and the ranges a pull read once read
mk "$T/r40" $((40 * 1024 * 1024))
"$VMSNAP" -q push "$T/r40" "$S/r40" || fail "push r40"
n=$(cached_pages "$S/r40")
[ "$n" -le 2 ] || fail "push left $n pages of the stored object cached"
"$VMSNAP" -q pull "$S/r40" "$T/r40.out" || fail "pull r40"
n=$(cached_pages "$S/r40")
[ "$n" -le 16 ] || fail "pull left $n pages of the stored object cached (edges of its ranges only)"
cmp -s "$T/r40" "$T/r40.out" || fail "r40 round trip differs"
rm -f "$T/r40.out"

# sizes 0 and 1, and a sparse 1 GiB image (only 2 MiB populated)
: >"$T/z0"
printf x >"$T/z1"
truncate -s 1G "$T/sp"
dd if=/dev/urandom of="$T/sp" bs=1M count=1 seek=100 conv=notrunc status=none
dd if=/dev/urandom of="$T/sp" bs=1M count=1 seek=1023 conv=notrunc status=none
for f in z0 z1 sp; do
    "$VMSNAP" -q push --part-size 64K "$T/$f" "file://$S/$f.zstd" || fail "push $f"
    "$VMSNAP" -q pull "$S/$f.zstd" "$T/$f.out" || fail "pull $f"
    cmp -s "$T/$f" "$T/$f.out" || fail "round trip of $f differs"
done
[ "$(stat -c %s "$T/sp.out")" = 1073741824 ] || fail "sparse image size"
[ "$(($(stat -c %b "$T/sp.out") * 512))" -lt $((16 * 1024 * 1024)) ] || fail "pulled image is not sparse"

# a snapshot set
mkdir "$T/set"
cp "$T/sp" "$T/set/memory-ranges"
echo '{"vcpus":1}' >"$T/set/state.json"
echo '{"memory":{"shared":true}}' >"$T/set/config.json"
echo base-123 >"$T/set/base-id"
"$VMSNAP" -q push -j 4 --part-size 64K "$T/set" "$S/sets/a" || fail "push set"
[ -f "$S/sets/a/manifest.json" ] || fail "no manifest"
for n in memory-ranges state.json config.json base-id; do
    [ -f "$S/sets/a/$n.zstd" ] || fail "no object for $n"
    grep -q "\"$n\"" "$S/sets/a/manifest.json" || fail "manifest misses $n"
done
grep -q '"sha256"' "$S/sets/a/manifest.json" || fail "manifest without digests"
"$VMSNAP" -q pull -j 3 "$S/sets/a" "$T/setout" || fail "pull set"
diff -r "$T/set" "$T/setout" >/dev/null || fail "set round trip differs"
[ "$(stat -c %a "$T/setout")" = 700 ] || fail "pulled set directory mode"
"$VMSNAP" ls "$S/sets" >"$T/ls" || fail "ls"
grep -q "$S/sets/a" "$T/ls" || fail "ls does not show the set: $(cat "$T/ls")"
grep -q "4 files" "$T/ls" || fail "ls summary: $(cat "$T/ls")"

# incomplete set (no manifest): refused, nothing created
cp -r "$S/sets/a" "$S/sets/inc"
rm "$S/sets/inc/manifest.json"
expect_fail "pull of an incomplete set" "$VMSNAP" pull "$S/sets/inc" "$T/incout"
grep -q "incomplete snapshot: no manifest at" "$T/err" || fail "incomplete: message: $(cat "$T/err")"
[ -e "$T/incout" ] && fail "pull of an incomplete set created $T/incout"

# hostile manifests
hostile() { # DESC JSON EXPECTED-WORDS
    rm -rf "$S/sets/h" "$T/hout"
    cp -r "$S/sets/a" "$S/sets/h"
    printf '%s' "$2" >"$S/sets/h/manifest.json"
    expect_fail "$1" "$VMSNAP" pull "$S/sets/h" "$T/hout"
    grep -qi "$3" "$T/err" || fail "$1: message: $(cat "$T/err")"
    [ -e "$T/hout" ] && fail "$1: left $T/hout"
    [ -e "$T/passwd" ] && fail "$1: wrote outside the destination"
    return 0
}
hostile "dot-dot name" '{"snapshotFiles":["../passwd"]}' "not a plain file name"
hostile "slash name" '{"snapshotFiles":["a/b"]}' "not a plain file name"
hostile "empty name" '{"snapshotFiles":[""]}' "not a plain file name"
hostile "dot name" '{"snapshotFiles":[".."]}' "not a plain file name"
hostile "NUL name" '{"snapshotFiles":["a\u0000b"]}' "not a plain file name"
hostile "missing file" '{"snapshotFiles":["nothere"]}' "missing"
hostile "duplicate" '{"snapshotFiles":["base-id","base-id"]}' "twice"
hostile "not json" '{"snapshotFiles":' "JSON"
hostile "huge size" "$(sed 's/"size":[0-9]*/"size":9223372036854775807/' "$S/sets/a/manifest.json")" "impossible sizes"
hostile "wrong digest" "$(sed '0,/"sha256":"[0-9a-f]/s//"sha256":"0/' "$S/sets/a/manifest.json" | sed 's/"sha256":"00/"sha256":"01/')" "sha256"
hostile "wrong object size" "$(sed '0,/"objectSize":/s//"objectSize":1/' "$S/sets/a/manifest.json")" "manifest says"

# a reference-style manifest (snapshotFiles only) is accepted
rm -rf "$S/sets/ref" && cp -r "$S/sets/a" "$S/sets/ref"
printf '{"snapshotFiles":["base-id","config.json","memory-ranges","state.json"],"sandboxClass":"x"}' >"$S/sets/ref/manifest.json"
"$VMSNAP" -q pull "$S/sets/ref" "$T/refout" || fail "reference manifest refused"
diff -r "$T/set" "$T/refout" >/dev/null || fail "reference manifest pull differs"

# rm: manifest first, then objects
"$VMSNAP" rm "$S/sets/ref" || fail "rm"
[ -e "$S/sets/ref/manifest.json" ] && fail "rm left the manifest"
[ -n "$(ls -A "$S/sets/ref")" ] && fail "rm left objects: $(ls -A "$S/sets/ref")"
expect_fail "rm of an incomplete set without --force" "$VMSNAP" rm "$S/sets/inc"
"$VMSNAP" rm --force "$S/sets/inc" || fail "rm --force"
[ -n "$(ls -A "$S/sets/inc")" ] && fail "rm --force left objects"

# a push killed mid-upload leaves no manifest, pull refuses it, the next push cleans up
mk "$T/kbig" $((64 * 1024 * 1024))
mkdir "$T/kset" && cp "$T/kbig" "$T/kset/memory-ranges" && echo s >"$T/kset/state.json"
"$VMSNAP" -q push -j 1 --part-size 64K --max-memory 128K "$T/kset" "$S/sets/k" &
pid=$!
for _ in $(seq 1 100); do
    ls -A "$S/sets/k" 2>/dev/null | grep -q 'mpu-' && break
    sleep 0.05
done
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null || true
[ -e "$S/sets/k/manifest.json" ] && fail "killed push left a manifest"
ls -A "$S/sets/k" | grep -q 'mpu-' || fail "test did not catch the push mid-upload"
expect_fail "pull after a killed push" "$VMSNAP" pull "$S/sets/k" "$T/kout"
"$VMSNAP" -q push "$T/kset" "$S/sets/k" || fail "push after a killed push"
ls -A "$S/sets/k" | grep -q 'mpu-' && fail "the retried push left the killed push's upload"
"$VMSNAP" -q pull "$S/sets/k" "$T/kout" || fail "pull after retried push"
cmp -s "$T/kbig" "$T/kout/memory-ranges" || fail "retried push differs"
"$VMSNAP" gc "$S/sets" 2>"$T/gc" || fail "gc"
grep -q "aborted 0" "$T/gc" || fail "gc found leftovers: $(cat "$T/gc")"

# disk full on pull: a 16 MiB tmpfs, a 40 MiB file
if [ "$(id -u)" = 0 ] && mkdir "$T/small" && mount -t tmpfs -o size=16m tmpfs "$T/small" 2>/dev/null; then
    mk "$T/f40" $((40 * 1024 * 1024))
    "$VMSNAP" -q push "$T/f40" "$S/f40" || fail "push f40"
    expect_fail "pull onto a full disk" "$VMSNAP" pull "$S/f40" "$T/small/f40"
    grep -qi "space" "$T/err" && grep -q "$T/small/f40: write" "$T/err" ||
        fail "disk full: the message names neither the cause nor the destination: $(cat "$T/err")"
    [ -n "$(ls -A "$T/small")" ] && fail "disk full: left $(ls -A "$T/small")"
    # unpack, parallel (seek table) and sequential (stdin): the same
    "$VMSNAP" -q pack "$T/f40" "$T/f40.vs" || fail "pack f40"
    expect_fail "unpack onto a full disk" "$VMSNAP" unpack "$T/f40.vs" "$T/small/u40"
    grep -q "$T/small/u40: write .*: No space" "$T/err" || fail "unpack disk full: $(cat "$T/err")"
    expect_fail "unpack from stdin onto a full disk" sh -c "'$VMSNAP' unpack - '$T/small/s40' <'$T/f40.vs'"
    grep -q "$T/small/s40: write .*: No space" "$T/err" || fail "stdin unpack disk full: $(cat "$T/err")"
    [ -n "$(ls -A "$T/small")" ] && fail "unpack disk full: left $(ls -A "$T/small")"
    umount "$T/small"
else
    echo "note: disk-full case needs root to mount a tmpfs; not run" >&2
    [ "${VMSNAP_REQUIRE_ALL:-0}" = 1 ] && fail "disk-full case could not run"
fi
done_tests
