#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Layered sets (the default layout): immutable objects under <set>/vmsnap-objects/<pushId>/, the
# manifest (formatVersion 3) the commit; a replace is one PUT and leaves the old objects as they
# were (gc removes what no manifest names, after its grace period); rm removes the manifest only;
# a killed push leaves the old set whole; two pushes at once leave one whole set; hostile
# manifests are refused with the reason and nothing is written. Deltas over a parent (--parent),
# chains, and the node cache. Run for the local store (LAYERS_STORE=local) and against the RGW
# (LAYERS_STORE=s3).
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/lib.sh"
export VMSNAP_LAYOUT=layered
export VMSNAP_CACHE_DIR=$T/cache # the node's object cache (used for remote stores only)
case "${LAYERS_STORE:-local}" in
local)
    ROOT=$T/store
    mkdir -p "$ROOT"
    U=$ROOT
    objects() { (cd "$ROOT" && find . -type f -path '*vmsnap-objects*' | sed 's|^\./||' | sort); }
    get_obj() { cp "$ROOT/$1" "$2"; }
    put_obj() { mkdir -p "$(dirname "$ROOT/$1")" && cp "$2" "$ROOT/$1"; }
    obj_key() { echo "${ROOT#/}/$1"; } # a manifest's key of the object at path $1 under ROOT
    obj_exists() { [ -e "$ROOT/$1" ]; }
    ;;
s3)
    . "$SRC/tests/integration/xfer_s3_lib.sh"
    export AWS_ENDPOINT_URL AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
    U=s3://$BUCKET
    ROOT=
    objects() { keys_under "" | grep vmsnap-objects | sort; }
    get_obj() { raw_get "$1" "$2"; }
    put_obj() { [ "$(raw_put "$1" "$2")" = 200 ] || fail "raw put $1"; }
    obj_key() { echo "$1"; }
    obj_exists() { [ "$(head_code "$1")" = 200 ]; }
    ;;
*) fail "LAYERS_STORE=$LAYERS_STORE" ;;
esac
# rel URL: the store path of a set URL (local: under ROOT; S3: the key)
rel() { if [ -n "$ROOT" ]; then echo "${1#"$ROOT"/}"; else echo "${1#s3://"$BUCKET"/}"; fi; }
man_get() { get_obj "$(rel "$1")/manifest.json" "$2"; }
man_put() { put_obj "$(rel "$1")/manifest.json" "$2"; }

# datamap FILE: its data extents (SEEK_DATA / SEEK_HOLE), one "start end" a line
datamap() {
    python3 -c 'import os,sys
fd = os.open(sys.argv[1], os.O_RDONLY); end = os.fstat(fd).st_size; off = 0
while off < end:
    try: d = os.lseek(fd, off, os.SEEK_DATA)
    except OSError: break
    h = os.lseek(fd, d, os.SEEK_HOLE); print(d, h); off = h' "$1"
}
# same_set DIR1 DIR2: the same files, byte for byte, with the same holes (an all-zero page is
# a hole in an image: DIR1's files are compared as cp --sparse=always leaves them)
same_set() {
    local f
    for f in "$1"/*; do
        cmp -s "$f" "$2/$(basename "$f")" || return 1
        cp --sparse=always "$f" "$T/sparse.tmp"
        [ "$(datamap "$T/sparse.tmp")" = "$(datamap "$2/$(basename "$f")")" ] || return 1
    done
    [ "$(ls "$1" | wc -l)" = "$(ls "$2" | wc -l)" ]
}

# a set: a sparse "memory" (64 MiB, 4 MiB of data in places), a small file, a tiny one
mkset() { # DIR SEED
    mkdir -p "$1"
    truncate -s 64M "$1/memory"
    local i
    for i in 3 100 2000 9000 15000; do
        head -c 819200 /dev/urandom | dd of="$1/memory" bs=4096 seek=$((i + $2)) conv=notrunc status=none
    done
    mk "$1/state" 300000
    echo "$2" >"$1/base-id"
}
mkset "$T/a" 1
mkset "$T/b" 7

# ---- push, pull, the layout ----
"$VMSNAP" -q push "$T/a" "$U/s1" || fail "push a"
man_get "$U/s1" "$T/m1.json"
[ "$(jget "$T/m1.json" 'j["formatVersion"]')" = 3 ] || fail "formatVersion: $(cat "$T/m1.json")"
[ "$(jget "$T/m1.json" '"snapshotFiles" in j')" = False ] ||
    fail "a layered manifest has snapshotFiles (the reference reader would look for <name>.zstd)"
[ "$(jget "$T/m1.json" 'sorted(j["files"])')" = "['base-id', 'memory', 'state']" ] ||
    fail "files: $(cat "$T/m1.json")"
objects >"$T/o1"
[ "$(wc -l <"$T/o1")" = 6 ] || fail "objects of the first push (3 images + 3 page tables): $(cat "$T/o1")"
grep -qv "/vmsnap-objects/$(jget "$T/m1.json" 'j["pushId"]')/" "$T/o1" && fail "an object outside vmsnap-objects/<pushId>/: $(cat "$T/o1")"
"$VMSNAP" -q pull "$U/s1" "$T/p1" || fail "pull s1"
same_set "$T/a" "$T/p1" || fail "pulled set differs from pushed"

# ---- a replace: one PUT; the old objects are not touched ----
for k in $(cat "$T/o1"); do get_obj "$k" "$T/before.$(echo "$k" | md5sum | cut -c1-8)"; done
"$VMSNAP" -q push "$T/b" "$U/s1" || fail "push b over s1"
for k in $(cat "$T/o1"); do
    get_obj "$k" "$T/after" || fail "replace removed $k"
    cmp -s "$T/after" "$T/before.$(echo "$k" | md5sum | cut -c1-8)" || fail "replace changed $k"
done
"$VMSNAP" -q pull "$U/s1" "$T/p2" || fail "pull s1 after the replace"
same_set "$T/b" "$T/p2" || fail "pull after the replace is not the new set"

# ---- gc: grace period, then reachability ----
"$VMSNAP" gc "$U" 2>"$T/gc1.err" || fail "gc (grace): $(cat "$T/gc1.err")"
grep -q "removed 0 objects\|aborted 0 unfinished uploads$" "$T/gc1.err" || true
[ "$(objects | wc -l)" = 12 ] || fail "gc within the grace period removed objects: $(objects)"
"$VMSNAP" gc --dry-run --older-than 0 "$U" >"$T/gcd.out" 2>&1 || fail "gc --dry-run"
[ "$(grep -c '^would remove	object' "$T/gcd.out")" = 6 ] || fail "gc --dry-run: $(cat "$T/gcd.out")"
grep -q "bytes	" "$T/gcd.out" || fail "gc --dry-run gives no sizes: $(cat "$T/gcd.out")"
[ "$(objects | wc -l)" = 12 ] || fail "gc --dry-run removed objects"
"$VMSNAP" -q gc --older-than 0 "$U" || fail "gc"
objects >"$T/o2"
[ "$(wc -l <"$T/o2")" = 6 ] || fail "gc left: $(cat "$T/o2")"
grep -q -f "$T/o1" "$T/o2" && fail "gc kept an object of the replaced set"
"$VMSNAP" -q pull "$U/s1" "$T/p3" && same_set "$T/b" "$T/p3" || fail "pull after gc"

# ---- rm: the manifest only; gc then takes the objects ----
"$VMSNAP" -q rm "$U/s1" || fail "rm s1"
[ "$(objects | wc -l)" = 6 ] || fail "rm removed objects of a layered set (other sets may name them)"
expect_fail "pull of a removed set" "$VMSNAP" pull "$U/s1" "$T/p4"
"$VMSNAP" -q gc --older-than 0 "$U" || fail "gc after rm"
[ "$(objects | wc -l)" = 0 ] || fail "gc after rm left: $(objects)"

# ---- a push killed before its commit leaves the old set; gc removes what it stored ----
"$VMSNAP" -q push "$T/a" "$U/k" || fail "push a to k"
VMSNAP_FAILPOINT=layered-uploaded:stop "$VMSNAP" -q push "$T/b" "$U/k" &
pid=$!
wait_stopped "$pid" || fail "the push never reached its commit"
kill_wait "$pid"
"$VMSNAP" -q pull "$U/k" "$T/k1" && same_set "$T/a" "$T/k1" || fail "a killed push lost the old set"
[ "$(objects | wc -l)" = 12 ] || fail "the killed push's objects: $(objects)"
"$VMSNAP" -q gc --older-than 0 "$U" || fail "gc after the killed push"
[ "$(objects | wc -l)" = 6 ] || fail "gc after the killed push left: $(objects)"
"$VMSNAP" -q pull "$U/k" "$T/k2" && same_set "$T/a" "$T/k2" || fail "gc took the set's objects"

# ---- two pushes at once to one URL: one whole set ----
"$VMSNAP" -q push "$T/a" "$U/c" &
p1=$!
"$VMSNAP" -q push "$T/b" "$U/c" &
p2=$!
wait "$p1" || fail "concurrent push 1"
wait "$p2" || fail "concurrent push 2"
"$VMSNAP" -q pull "$U/c" "$T/c1" || fail "pull after concurrent pushes"
same_set "$T/a" "$T/c1" || same_set "$T/b" "$T/c1" || fail "concurrent pushes left a mixed set"

# ---- hostile manifests: refused, naming the reason; nothing written ----
man_get "$U/k" "$T/good.json"
hostile() { # DESC WORDS PYTHON-EDIT (of j, the manifest)
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); exec(sys.argv[2]); json.dump(j, open(sys.argv[3], "w"))' \
        "$T/good.json" "$3" "$T/bad.json"
    man_put "$U/k" "$T/bad.json"
    rm -rf "$T/h"
    # --no-cache: the store's objects themselves (a cached layer is found by its digest, so a
    # manifest pointing at another object with the right digest gets the right bytes)
    "$VMSNAP" pull --no-cache "$U/k" "$T/h" 2>"$T/h.err" && fail "$1: pulled"
    grep -q "$2" "$T/h.err" || fail "$1: the error does not say '$2': $(cat "$T/h.err")"
    [ ! -e "$T/h" ] || fail "$1: the pull left $T/h"
}
L='j["files"]["memory"]["layers"]'
hostile "a key with .." "needs a key of a layer object" "$L[0][\"key\"] = $L[0][\"key\"].replace(\"vmsnap-objects\", \"vmsnap-objects/../../x/vmsnap-objects\")"
hostile "a key outside vmsnap-objects" "needs a key of a layer object" "$L[0][\"key\"] = \"$(obj_key k/manifest.json)\""
hostile "an absolute key" "needs a key of a layer object" "$L[0][\"key\"] = \"/etc/vmsnap-objects/0/x.zstd\""
hostile "another file's object" "does not match\|bytes, the manifest says" "$L[0][\"key\"] = j[\"files\"][\"state\"][\"layers\"][0][\"key\"]"
hostile "a delta first" "must be a full image" "$L[0][\"delta\"] = True"
hostile "65 layers" "layers (1 to 64)" "$L.extend([dict($L[0], delta=True)] * 64)"
hostile "a short last layer" "its last layer makes" "j[\"files\"][\"memory\"][\"size\"] += 4096"
hostile "a file name with a slash" "not a plain file name" "j[\"files\"][\"../x\"] = j[\"files\"].pop(\"state\")"
man_put "$U/k" "$T/good.json"
"$VMSNAP" -q pull "$U/k" "$T/k3" && same_set "$T/a" "$T/k3" || fail "the good manifest back"

# ---- the reference layout stays: --layout reference and VMSNAP_LAYOUT ----
"$VMSNAP" -q push --layout reference "$T/a" "$U/r" || fail "push --layout reference"
obj_exists "$(rel "$U/r")/memory.zstd" || fail "no memory.zstd in a reference set"
man_get "$U/r" "$T/r.json"
[ "$(jget "$T/r.json" 'j["snapshotFiles"] == ["base-id", "memory", "state"]')" = True ] ||
    fail "reference manifest: $(cat "$T/r.json")"
# a layered push over it: the reference objects are dead, and gc takes them
"$VMSNAP" -q push "$T/b" "$U/r" || fail "layered push over a reference set"
"$VMSNAP" -q gc --older-than 0 "$U" || fail "gc after layered over reference"
obj_exists "$(rel "$U/r")/memory.zstd" && fail "gc kept the dead memory.zstd"
"$VMSNAP" -q pull "$U/r" "$T/r3" && same_set "$T/b" "$T/r3" || fail "pull of r"
# a reference push over a layered set: pull gives it, gc takes the layered objects
"$VMSNAP" -q push --layout reference "$T/a" "$U/r" || fail "reference push over a layered set"
"$VMSNAP" -q pull "$U/r" "$T/r4" && same_set "$T/a" "$T/r4" || fail "pull of the reference set"
"$VMSNAP" -q gc --older-than 0 "$U" || fail "gc after reference over layered"
objects | grep -q "^$(rel "$U/r")/" && fail "gc kept the layered objects of r: $(objects)"
"$VMSNAP" -q pull "$U/r" "$T/r5" && same_set "$T/a" "$T/r5" || fail "pull of r after gc"
VMSNAP_LAYOUT=bogus "$VMSNAP" push "$T/a" "$U/x" 2>"$T/lay.err" && fail "VMSNAP_LAYOUT=bogus taken"
grep -q "VMSNAP_LAYOUT" "$T/lay.err" || fail "VMSNAP_LAYOUT=bogus: $(cat "$T/lay.err")"

# ---- a parent that is not a layered set: full layers, said so ----
"$VMSNAP" push --parent "$U/r" "$T/b" "$U/np" 2>"$T/np.err" || fail "push with a reference parent"
grep -q "not a layered set" "$T/np.err" || fail "reference parent not named: $(cat "$T/np.err")"
expect_fail "--parent on a file push" "$VMSNAP" push --parent "$U/k" "$T/a/state" "$U/f"
expect_fail "--parent with --layout reference" "$VMSNAP" push --layout reference --parent "$U/k" "$T/a" "$U/f"

# ---- deltas over a parent ----
# layers J: the memory file's chain in the set at URL J, as "delta,delta,..." (False = full)
layers() { man_get "$1" "$T/lm.json" && jget "$T/lm.json" '",".join(str(l["delta"]) for l in j["files"]["memory"]["layers"])'; }
# change DIR SEED: rewrite 16 pages, zero 8 (zero pages are holes), punch 8, grow state; the
# same SEED makes the same change
change() {
    [ -f "$T/chg.$2" ] || head -c 65536 /dev/urandom >"$T/chg.$2"
    dd if="$T/chg.$2" of="$1/memory" bs=4096 seek=$((103 + $2 % 50)) conv=notrunc status=none
    dd if=/dev/zero of="$1/memory" bs=4096 seek=2003 count=8 conv=notrunc status=none
    fallocate -p -o $((9003 * 4096)) -l 32768 "$1/memory"
    head -c 5000 "$T/chg.$2" >>"$1/state"
}
"$VMSNAP" -q push "$T/a" "$U/gold" || fail "push gold"
cp -a "$T/a" "$T/d1" && change "$T/d1" 1
"$VMSNAP" push --json --parent "$U/gold" "$T/d1" "$U/d1" >"$T/d1.json" || fail "push --parent"
[ "$(layers "$U/d1")" = "False,True" ] || fail "d1's memory chain: $(layers "$U/d1")"
# memory and state as deltas; base-id (3 bytes) whole: its delta is no smaller than the image
[ "$(jget "$T/d1.json" 'j["deltas"]')" = 2 ] || fail "d1: deltas: $(cat "$T/d1.json")"
man_get "$U/d1" "$T/d1m.json"
[ "$(jget "$T/d1m.json" 'len(j["files"]["base-id"]["layers"])')" = 1 ] ||
    fail "d1: base-id has a delta no smaller than its full image"
man_get "$U/d1" "$T/d1m.json"
dsz=$(jget "$T/d1m.json" 'j["files"]["memory"]["layers"][1]["objectSize"]')
[ "$dsz" -lt 200000 ] || fail "a delta of 16 changed pages is $dsz bytes"
[ "$(jget "$T/d1m.json" 'j["parent"]')" = "$U/gold" ] || fail "d1's parent: $(cat "$T/d1m.json")"
"$VMSNAP" -q pull "$U/d1" "$T/pd1" && same_set "$T/d1" "$T/pd1" || fail "pull of a delta set"
# the delta object alone is a valid stream (vmsnap and the reference reader decode it)
get_obj "$(jget "$T/d1m.json" 'j["files"]["memory"]["layers"][1]["key"]' | sed "s|^${ROOT#/}/||")" "$T/delta.zstd"
"${VMSNAP_BUILD:?}/tests/image_interop" --read "$T/delta.zstd" "$T/delta.out" ||
    fail "the reference reader refused a delta object"
# a chain: each push over the one before; the 9th gets a full layer (--max-depth 8)
prev=$U/d1 && cp -a "$T/d1" "$T/dn"
for n in 2 3 4 5 6 7 8 9; do
    change "$T/dn" "$n"
    "$VMSNAP" -q push --parent "$prev" "$T/dn" "$U/d$n" 2>"$T/dn.err" || fail "push d$n: $(cat "$T/dn.err")"
    prev=$U/d$n
done
# (d1 has 2 layers: d7 has 8, d8 is past --max-depth)
[ "$(layers "$U/d7")" = "False,True,True,True,True,True,True,True" ] || fail "d7's chain: $(layers "$U/d7")"
[ "$(layers "$U/d8")" = "False" ] || fail "d8 (past --max-depth): $(layers "$U/d8")"
[ "$(layers "$U/d9")" = "False,True" ] || fail "d9: $(layers "$U/d9")"
# the chain of 8 rebuilds the file as it was when pushed
cp -a "$T/d1" "$T/chk" && for n in 2 3 4 5 6 7; do change "$T/chk" "$n"; done
"$VMSNAP" -q pull "$U/d7" "$T/pd7" && same_set "$T/chk" "$T/pd7" || fail "pull of a chain of 8"
"$VMSNAP" -q pull "$U/d9" "$T/pd9" && same_set "$T/dn" "$T/pd9" || fail "pull d9"
# deltas that rewrite the same pages: a pull reads only the newest of them (the chain's page
# tables say which layer gives which page) and the golden's frames it still needs
cp -a "$T/a" "$T/rw"
"$VMSNAP" -q push "$T/rw" "$U/rw0" || fail "push rw0"
for n in 1 2 3; do
    head -c 65536 /dev/urandom | dd of="$T/rw/memory" bs=4096 seek=500 conv=notrunc status=none
    "$VMSNAP" -q push --parent "$U/rw$((n - 1))" "$T/rw" "$U/rw$n" || fail "push rw$n"
done
[ "$(layers "$U/rw3")" = "False,True,True,True" ] || fail "rw3's chain: $(layers "$U/rw3")"
rm -rf "$T/prw"
"$VMSNAP" pull --json --no-cache "$U/rw3" "$T/prw" >"$T/prw.json" || fail "pull rw3"
same_set "$T/rw" "$T/prw" || fail "pull of rw3 differs"
man_get "$U/rw3" "$T/rw3m.json"
python3 - "$T/rw3m.json" "$T/prw.json" <<'PYEOF' || fail "rw3: the replaced deltas were read: $(cat "$T/prw.json")"
import json, sys
m, p = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
# of every file, the full image and the newest delta: memory's older deltas rewrote the pages
# the newest rewrote again, the other files' deltas changed nothing
need = sum(f["layers"][0]["objectSize"] + (f["layers"][-1]["objectSize"] if len(f["layers"]) > 1 else 0)
           for f in m["files"].values())
assert p["object_bytes"] == need, (p["object_bytes"], need)
PYEOF
# a file that shrinks in one layer and grows again in a later one: the grown part is zeros,
# not the older layers' bytes
mkdir -p "$T/sg" && head -c 40960 /dev/urandom >"$T/sg/mem"
"$VMSNAP" -q push "$T/sg" "$U/sg0" || fail "push sg0"
truncate -s 20480 "$T/sg/mem" && head -c 4096 /dev/urandom | dd of="$T/sg/mem" conv=notrunc status=none
"$VMSNAP" -q push --parent "$U/sg0" "$T/sg" "$U/sg1" || fail "push sg1"
truncate -s 40960 "$T/sg/mem" && head -c 4096 /dev/urandom | dd of="$T/sg/mem" bs=4096 seek=1 conv=notrunc status=none
"$VMSNAP" -q push --parent "$U/sg1" "$T/sg" "$U/sg2" || fail "push sg2"
rm -rf "$T/psg"
"$VMSNAP" -q pull --no-cache "$U/sg2" "$T/psg" && same_set "$T/sg" "$T/psg" ||
    fail "shrink then grow: the pulled file differs (old bytes came back?)"
# a delta that rewrites 3 MiB in one run: its records outlast the decoder's 2 MiB pieces of
# output, so whole pages arrive split in two; each must come from the delta, not the golden
mkdir -p "$T/lr" && head -c $((16 << 20)) /dev/urandom >"$T/lr/memory"
"$VMSNAP" -q push "$T/lr" "$U/lr1" || fail "push lr1"
head -c $((3 << 20)) /dev/urandom | dd of="$T/lr/memory" bs=1M seek=4 conv=notrunc status=none
"$VMSNAP" -q push --parent "$U/lr1" "$T/lr" "$U/lr2" || fail "push lr2"
[ "$(layers "$U/lr2")" = "False,True" ] || fail "lr2 not a delta: $(layers "$U/lr2")"
rm -rf "$T/plr"
"$VMSNAP" -q pull --no-cache "$U/lr2" "$T/plr" && same_set "$T/lr" "$T/plr" ||
    fail "a delta's long run: the pulled file differs (pages of the golden at its 2 MiB seams?)"
# more than half of the pages changed: a full layer
cp -a "$T/a" "$T/big" && head -c 4194304 /dev/urandom | dd of="$T/big/memory" bs=4096 seek=3 conv=notrunc status=none
"$VMSNAP" -q push --parent "$U/gold" "$T/big" "$U/big" || fail "push big"
[ "$(layers "$U/big")" = "False" ] || fail "a delta of most pages: $(layers "$U/big")"
# the golden replaced and removed, gc run: its children still pull (they name its layers)
"$VMSNAP" -q push "$T/b" "$U/gold" && "$VMSNAP" -q rm "$U/gold" || fail "replace and rm gold"
"$VMSNAP" -q gc --older-than 0 "$U" || fail "gc with children of a removed golden"
"$VMSNAP" -q pull "$U/d1" "$T/pd1b" && same_set "$T/d1" "$T/pd1b" || fail "a child after its golden went"
# the parent replaced and its layers collected while a child push runs: the push sees it
# before its commit (the parent's manifest changed: every layer looked at) and stores nothing
"$VMSNAP" -q push "$T/a" "$U/p2" || fail "push p2"
cp -a "$T/a" "$T/ch" && change "$T/ch" 31
VMSNAP_FAILPOINT=layered-uploaded:stop "$VMSNAP" -q push --parent "$U/p2" "$T/ch" "$U/ch" 2>"$T/ch.err" &
pid=$!
wait_stopped "$pid" || fail "the child push never reached its commit"
"$VMSNAP" -q push "$T/b" "$U/p2" && "$VMSNAP" -q gc --older-than 0 "$U/p2" || fail "replace and gc p2"
kill -CONT "$pid"
rc=0 && wait "$pid" || rc=$?
[ "$rc" != 0 ] || fail "a child push over a collected parent committed"
grep -q "is gone or changed" "$T/ch.err" || fail "the collected parent not said: $(cat "$T/ch.err")"
expect_fail "pull of the child that did not commit" "$VMSNAP" pull "$U/ch" "$T/chp"
# a layer gone from the store: the pull refuses, naming it
man_get "$U/d1" "$T/d1m.json"
k0=$(jget "$T/d1m.json" 'j["files"]["memory"]["layers"][0]["key"]')
obj_rm() { if [ -n "$ROOT" ]; then rm -f "/$1"; else s3curl DELETE "$BUCKET/$1" >/dev/null; fi; }
obj_rm "$k0"
rm -rf "$T/pd1c"
"$VMSNAP" pull --no-cache "$U/d1" "$T/pd1c" 2>"$T/miss.err" && fail "pull with a layer missing"
grep -q "layer 1 of 2" "$T/miss.err" || fail "the missing layer not named: $(cat "$T/miss.err")"
[ ! -e "$T/pd1c" ] || fail "a failed pull left its directory"
# a parent whose page table does not match its manifest: a full layer, with a warning
man_get "$U/d2" "$T/d2m.json"
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); j["files"]["memory"]["pages"]["sha256"]="0"*64; json.dump(j,open(sys.argv[1],"w"))' "$T/d2m.json"
man_put "$U/d2" "$T/d2m.json"
"$VMSNAP" push --parent "$U/d2" "$T/dn" "$U/d2x" 2>"$T/d2x.err" || fail "push over a bad page table"
grep -q "does not match" "$T/d2x.err" || fail "the bad page table not said: $(cat "$T/d2x.err")"
[ "$(layers "$U/d2x")" = "False" ] || fail "d2x: $(layers "$U/d2x")"

# ---- gc: the same store under another spelling, unreadable directories, newer manifests ----
if [ -n "$ROOT" ]; then
    ln -s "$ROOT" "$T/link"
    "$VMSNAP" -q push "$T/a" "$T/link/sl0" && cp -a "$T/a" "$T/sl" && change "$T/sl" 41 &&
        "$VMSNAP" -q push --parent "$T/link/sl0" "$T/sl" "$T/link/sl1" || fail "push through a symlink"
    "$VMSNAP" -q gc --older-than 0 "$ROOT" || fail "gc through the real path"
    "$VMSNAP" -q pull "$T/link/sl1" "$T/psl" && same_set "$T/sl" "$T/psl" ||
        fail "gc through another spelling of the store removed named layers"
    # a directory gc cannot list (as nobody): nothing of the layers is removed
    if command -v setpriv >/dev/null; then
        mkdir -p "$T/g2" && chmod 755 "$T" "$T/g2"
        "$VMSNAP" -q push "$T/a" "$T/g2/gold" && "$VMSNAP" -q push --parent "$T/g2/gold" "$T/d1" "$T/g2/priv/kid" &&
            "$VMSNAP" -q push "$T/b" "$T/g2/gold" || fail "push g2"
        chmod 700 "$T/g2/priv" && chown -R nobody "$T/g2" && chown root "$T/g2/priv"
        setpriv --reuid=nobody --regid=nogroup --clear-groups "$VMSNAP" gc --older-than 0 "$T/g2" 2>"$T/g2.err" &&
            fail "gc with an unreadable directory succeeded"
        chown -R root "$T/g2"
        "$VMSNAP" -q pull "$T/g2/priv/kid" "$T/pkid" || fail "gc past an unreadable directory removed its layers: $(cat "$T/g2.err")"
    fi
fi
# a manifest of a newer format (or one this version refuses) stops the sweep: it may name layers
"$VMSNAP" -q push "$T/a" "$U/nv0" && "$VMSNAP" -q push --parent "$U/nv0" "$T/d1" "$U/nv1" &&
    "$VMSNAP" -q push "$T/b" "$U/nv0" || fail "push nv"
man_get "$U/nv1" "$T/nv1.json"
sed 's/"formatVersion":3/"formatVersion":4/' "$T/nv1.json" >"$T/nv1b.json" && man_put "$U/nv1" "$T/nv1b.json"
"$VMSNAP" gc --older-than 0 "$U" 2>"$T/nv.err" && fail "gc past a formatVersion 4 manifest succeeded"
grep -q "nothing swept" "$T/nv.err" || fail "the newer manifest not named: $(cat "$T/nv.err")"
man_put "$U/nv1" "$T/nv1.json"
"$VMSNAP" -q pull "$U/nv1" "$T/pnv" || fail "a gc past a newer manifest removed its layers"

# ---- export: the reference layout, read by a reader that knows only the reference format ----
"$VMSNAP" -q push "$T/a" "$U/ex" || fail "push ex"
"$VMSNAP" export --json "$U/ex" "$U/exref" >"$T/ex.json" || fail "export"
jget "$T/ex.json" 'j["files"]' | grep -qx 3 || fail "export --json: $(cat "$T/ex.json")"
man_get "$U/exref" "$T/exref.json"
[ "$(jget "$T/exref.json" 'j["snapshotFiles"] == ["base-id", "memory", "state"]')" = True ] ||
    fail "exported manifest: $(cat "$T/exref.json")"
for f in base-id memory state; do
    get_obj "$(rel "$U/exref")/$f.zstd" "$T/exobj"
    "${VMSNAP_BUILD:?}/tests/image_interop" --read "$T/exobj" "$T/exout" ||
        fail "the reference reader refused the exported $f"
    cmp -s "$T/exout" "$T/a/$f" || fail "the reference reader's $f differs from the pushed file"
done
ls -d "${TMPDIR:-/var/tmp}"/.vmsnap-export.* 2>/dev/null && fail "export left its temporary directory"
expect_fail "export of nothing" "$VMSNAP" export "$U/none" "$U/exnone"

# ---- the node's object cache (remote stores) ----
# gc, and a manifest rewritten while it marks within the same second, to the same size, so
# that its second listing shows it unchanged: it names layers the first read did not (here a
# child's manifest put over an unrelated set's), which are old and otherwise unreachable; a
# manifest as recent as the newest listed is read again whatever the listing says
if [ -n "$ROOT" ]; then
    mkdir -p "$T/rg" && head -c $((2 << 20)) /dev/urandom >"$T/rg/memory"
    "$VMSNAP" -q push "$T/rg" "$U/rg0" || fail "push rg0"
    head -c 8192 /dev/urandom | dd of="$T/rg/memory" bs=4096 seek=9 conv=notrunc status=none
    "$VMSNAP" -q push --parent "$U/rg0" "$T/rg" "$U/rg1" || fail "push rg1"
    cp "$ROOT/rg1/manifest.json" "$T/rgB.json"
    "$VMSNAP" -q push "$T/b" "$U/rg2" || fail "push rg2"
    python3 - "$ROOT/rg2/manifest.json" "$T/rgB.json" <<'PYEOF'
import sys
a, b = open(sys.argv[1]).read().rstrip(), open(sys.argv[2]).read().rstrip()
n = max(len(a), len(b)) + 1
open(sys.argv[1], "w").write(a + " " * (n - len(a)))
open(sys.argv[2], "w").write(b + " " * (n - len(b)))
PYEOF
    [ "$(stat -c %s "$ROOT/rg2/manifest.json")" = "$(stat -c %s "$T/rgB.json")" ] || fail "padding"
    "$VMSNAP" -q rm "$U/rg1" && "$VMSNAP" -q rm "$U/rg0" || fail "rm rg0 rg1"
    find "$ROOT/rg0" "$ROOT/rg1" -type f -path '*vmsnap-objects*' -exec touch -d '2 hours ago' {} +
    VMSNAP_FAILPOINT=gc-marked:stop "$VMSNAP" -q gc "$U" 2>"$T/rgc.err" &
    gpid=$!
    wait_stopped "$gpid" || fail "gc never reached its second listing: $(cat "$T/rgc.err")"
    cp "$T/rgB.json" "$T/rgB.tmp" && touch -r "$ROOT/rg2/manifest.json" "$T/rgB.tmp" &&
        mv "$T/rgB.tmp" "$ROOT/rg2/manifest.json" || fail "rewrite rg2's manifest"
    kill -CONT "$gpid"
    wait "$gpid" || fail "gc: $(cat "$T/rgc.err")"
    rm -rf "$T/prg" && "$VMSNAP" -q pull "$U/rg2" "$T/prg" 2>"$T/prg.err" ||
        fail "gc removed layers of a manifest rewritten in the same second: $(cat "$T/prg.err")"
    cmp -s "$T/rg/memory" "$T/prg/memory" || fail "rg2 (rg1's manifest) pulled wrong"
fi

if [ "${LAYERS_STORE:-local}" = s3 ]; then
    rm -rf "$VMSNAP_CACHE_DIR"
    "$VMSNAP" -q push "$T/a" "$U/g" || fail "push g"
    "$VMSNAP" pull --json "$U/g" "$T/g1" >"$T/g1.json" || fail "pull g (cold)"
    [ "$(jget "$T/g1.json" 'j["cached_bytes"]')" = 0 ] || fail "a cold pull read the cache: $(cat "$T/g1.json")"
    "$VMSNAP" pull --json "$U/g" "$T/g2" >"$T/g2.json" || fail "pull g (warm)"
    [ "$(jget "$T/g2.json" 'j["cached_bytes"] == j["object_bytes"] > 0')" = True ] ||
        fail "a warm pull fetched again: $(cat "$T/g2.json")"
    same_set "$T/a" "$T/g2" || fail "pull from the cache differs"
    "$VMSNAP" cache objects --json >"$T/co.json" || fail "cache objects"
    [ "$(jget "$T/co.json" 'len(j["entries"])')" = 3 ] || fail "cache entries: $(cat "$T/co.json")"
    # the cache holds none of its reads in the page cache
    [ "$(cached_pages "$VMSNAP_CACHE_DIR/objects")" = 0 ] || fail "cache entries left in the page cache"
    # a damaged entry: dropped, fetched again, the pull whole
    e=$(ls -S "$VMSNAP_CACHE_DIR/objects" | head -1)
    chmod u+w "$VMSNAP_CACHE_DIR/objects/$e"
    printf 'X' | dd of="$VMSNAP_CACHE_DIR/objects/$e" bs=1 seek=5000 conv=notrunc status=none
    "$VMSNAP" pull "$U/g" "$T/g3" 2>"$T/g3.err" || fail "pull over a damaged cache entry: $(cat "$T/g3.err")"
    grep -q "damaged" "$T/g3.err" || fail "the damaged entry not named: $(cat "$T/g3.err")"
    same_set "$T/a" "$T/g3" || fail "pull over a damaged entry differs"
    # pulls at once of one set on an empty cache fetch each object once between them
    rm -rf "$VMSNAP_CACHE_DIR"
    for n in 1 2 3; do "$VMSNAP" pull --json "$U/g" "$T/gc$n" >"$T/gc$n.json" & done
    wait || fail "concurrent pulls"
    fetched=$(python3 -c 'import json,sys; print(sum(json.load(open(f))["object_bytes"] - json.load(open(f))["cached_bytes"] for f in sys.argv[1:]))' "$T"/gc[123].json)
    [ "$fetched" = "$(jget "$T/g1.json" 'j["object_bytes"]')" ] ||
        fail "3 pulls at once fetched $fetched bytes, the set has $(jget "$T/g1.json" 'j["object_bytes"]')"
    for n in 1 2 3; do same_set "$T/a" "$T/gc$n" || fail "concurrent pull $n differs"; done
    # a chain whose newest layer's cached copy is damaged mid-way (several frames), and whose
    # page table's cached copy is damaged: both dropped and fetched again, the file whole
    rm -rf "$VMSNAP_CACHE_DIR"
    mkdir -p "$T/dm" && head -c $((8 << 20)) /dev/urandom >"$T/dm/mem"
    "$VMSNAP" -q push --frame-size 1M "$T/dm" "$U/dm0" || fail "push dm0"
    head -c 4096 /dev/urandom | dd of="$T/dm/mem" bs=4096 seek=3 conv=notrunc status=none
    head -c 4096 /dev/urandom | dd of="$T/dm/mem" bs=4096 seek=1793 conv=notrunc status=none
    "$VMSNAP" -q push --frame-size 1M --parent "$U/dm0" "$T/dm" "$U/dm1" || fail "push dm1"
    "$VMSNAP" -q pull "$U/dm1" "$T/pdm0" || fail "pull dm1 (fills the cache)"
    man_get "$U/dm1" "$T/dm1m.json"
    dk=t-$(jget "$T/dm1m.json" 'j["files"]["mem"]["layers"][1]["tableSha256"]')
    pk=s-$(jget "$T/dm1m.json" 'j["files"]["mem"]["layers"][0]["pages"]["sha256"]')
    for e in "$dk" "$pk"; do
        chmod u+w "$VMSNAP_CACHE_DIR/objects/$e"
        sz=$(stat -c %s "$VMSNAP_CACHE_DIR/objects/$e")
        printf 'X' | dd of="$VMSNAP_CACHE_DIR/objects/$e" bs=1 seek=$((sz * 2 / 3)) conv=notrunc status=none
    done
    rm -rf "$T/pdm"
    "$VMSNAP" pull -T 1 "$U/dm1" "$T/pdm" 2>"$T/pdm.err" || fail "pull over damaged entries: $(cat "$T/pdm.err")"
    [ "$(grep -c damaged "$T/pdm.err")" -ge 2 ] || fail "damaged entries not said: $(cat "$T/pdm.err")"
    same_set "$T/dm" "$T/pdm" || fail "a pull over a damaged cached layer built a wrong file"
    # --write-cache: a push keeps what it stores (layers, page tables) in the node's cache, so
    # a pull of the set, and of a delta over it, fetches nothing; no page cache left behind
    rm -rf "$VMSNAP_CACHE_DIR"
    "$VMSNAP" -q push --write-cache "$T/lr" "$U/wc0" || fail "push --write-cache wc0"
    head -c $((3 << 20)) /dev/urandom | dd of="$T/lr/memory" bs=1M seek=9 conv=notrunc status=none
    "$VMSNAP" -q push --write-cache --parent "$U/wc0" "$T/lr" "$U/wc1" || fail "push wc1"
    [ "$(cached_pages "$VMSNAP_CACHE_DIR/objects")" = 0 ] || fail "written-through entries left in the page cache"
    [ -z "$(ls "$VMSNAP_CACHE_DIR/tmp")" ] || fail "write-through temporaries left: $(ls "$VMSNAP_CACHE_DIR/tmp")"
    "$VMSNAP" pull --json "$U/wc1" "$T/pwc1" >"$T/wc1.json" || fail "pull wc1"
    [ "$(jget "$T/wc1.json" 'j["cached_bytes"] == j["object_bytes"] > 0')" = True ] ||
        fail "a pull after --write-cache fetched: $(cat "$T/wc1.json")"
    same_set "$T/lr" "$T/pwc1" || fail "a pull of written-through layers differs"
    "$VMSNAP" cache objects --json >"$T/wco.json" || fail "cache objects"
    # two layers and their two page tables (the pull fetched no table either)
    [ "$(jget "$T/wco.json" 'len(j["entries"])')" = 4 ] || fail "written-through entries: $(cat "$T/wco.json")"
    # --no-cache: fetched, the cache not touched
    "$VMSNAP" pull --no-cache --json "$U/g" "$T/g4" >"$T/g4.json" || fail "pull --no-cache"
    [ "$(jget "$T/g4.json" 'j["cached_bytes"]')" = 0 ] || fail "--no-cache read the cache"
fi

done_tests
