#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# disk create at its limits: an image with exactly 65,536 inodes filled to the last one is
# e2fsck-clean; one entry more fails with "out of inodes" and the numbers; a file larger than
# the image fails with "out of space" and the numbers; neither leaves anything at the
# destination (nor a temporary file beside it). Hostile inputs: a FIFO (refused, not waited on),
# truncated images and lying superblocks (refused; nothing written past the image), a tree
# deeper than 1000 levels, more hard links than ext4 allows.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/lib.sh"
command -v e2fsck >/dev/null || skip "e2fsprogs not installed"

no_leftovers() { # IMAGE DESC
    [ ! -e "$1" ] || fail "$2: image left at the destination"
    if ls -a "$(dirname "$1")" | grep -q "^\.$(basename "$1")\."; then fail "$2: temporary file left"; fi
}

# 65,536 inodes: 11 reserved (1-10 and lost+found) + 65,525 from the source.
python3 - "$T/full" 65525 <<'PYEOF'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
os.mkdir(root)
dirs = 5
for d in range(dirs):
    os.mkdir(os.path.join(root, "d%d" % d))
for i in range(n - dirs):
    open(os.path.join(root, "d%d" % (i % dirs), "f%06d" % i), "w").close()
PYEOF
"$VMSNAP" disk create --size 256M --inodes 65536 --from-dir "$T/full" "$T/full.img" ||
    fail "create with exactly 65536 inodes"
if [ -e "$T/full.img" ]; then
    e2fsck -fn "$T/full.img" >"$T/fsck" 2>&1 || fail "full: e2fsck not clean: $(tail "$T/fsck")"
    "$VMSNAP" disk info --json "$T/full.img" >"$T/info.json"
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert (j["inodes_total"], j["inodes_free"]) == (65536, 0), j' \
        "$T/info.json" || fail "full: want 65536 inodes, none free"
fi

touch "$T/full/one-more"
expect_fail "out of inodes" "$VMSNAP" disk create --size 256M --inodes 65536 --from-dir "$T/full" "$T/over.img"
grep -q "out of inodes" "$T/err" && grep -q "65536" "$T/err" && grep -q -- "--inodes" "$T/err" ||
    fail "out of inodes: unclear error: $(cat "$T/err")"
no_leftovers "$T/over.img" "out of inodes"

# out of space: 6 MiB of data into a 4 MiB image
head -c $((6 << 20)) /dev/urandom >"$T/big"
expect_fail "out of space" "$VMSNAP" disk create --size 4M --add "$T/big:/big" "$T/small.img"
grep -q "out of space" "$T/err" && grep -q "blocks" "$T/err" && grep -q -- "--size" "$T/err" ||
    fail "out of space: unclear error: $(cat "$T/err")"
grep -q "$T/big" "$T/err" || fail "out of space: source not named: $(cat "$T/err")"
no_leftovers "$T/small.img" "out of space"
# ... and out of space for a directory's own blocks (4,000 long names in one directory): the
# message names the directory inside the image
mkdir -p "$T/longdir/tree/many"
(cd "$T/longdir/tree/many" && for i in $(seq 1 4000); do : >"$(printf 'f%0200d' "$i")"; done)
expect_fail "out of space for a directory" "$VMSNAP" disk create --size 1400K --inodes 4100 \
    --from-dir "$T/longdir" "$T/dir.img"
grep -q "out of space writing directory /tree/many: 0 of [0-9]* blocks" "$T/err" ||
    fail "out of space for a directory: $(cat "$T/err")"
no_leftovers "$T/dir.img" "out of space for a directory"
rm -rf "$T/longdir"

# an existing image is left untouched by a failing --force create
"$VMSNAP" disk create --size 8M "$T/keep.img"
sum=$(md5sum <"$T/keep.img")
expect_fail "out of space over an existing image" "$VMSNAP" disk create --force --size 4M \
    --add "$T/big:/big" "$T/keep.img"
[ "$(md5sum <"$T/keep.img")" = "$sum" ] || fail "failed --force create changed the existing image"

# the largest file that fits does fit (no off-by-one in the accounting): fill to the brim
"$VMSNAP" disk create --size 16M --add "$T/big:/big" "$T/fits.img" || fail "6 MiB into 16 MiB"
e2fsck -fn "$T/fits.img" >"$T/fsck" 2>&1 || fail "fits: e2fsck: $(tail "$T/fsck")"

# hostile or broken inputs: refused clearly, never waited on, nothing written past the image
mkfifo "$T/fifo"
rc=0
timeout 20 "$VMSNAP" disk info "$T/fifo" >"$T/out" 2>"$T/err" || rc=$?
[ "$rc" = 1 ] && grep -q "not a regular file" "$T/err" || fail "disk info of a FIFO: exit $rc, $(cat "$T/err")"
rc=0
timeout 20 "$VMSNAP" disk clone "$T/fifo" "$T/fifo.img" >"$T/out" 2>"$T/err" || rc=$?
[ "$rc" = 1 ] || fail "disk clone of a FIFO: exit $rc, $(cat "$T/err")"
no_leftovers "$T/fifo.img" "clone of a FIFO"
"$VMSNAP" disk create --size 64M "$T/g.img"
head -c 1M "$T/g.img" >"$T/trunc.img"
expect_fail "info of a truncated image" "$VMSNAP" disk info "$T/trunc.img"
grep -q "truncated" "$T/err" || fail "truncated image: $(cat "$T/err")"
expect_fail "clone --new-uuid of a truncated image" "$VMSNAP" disk clone --new-uuid "$T/trunc.img" "$T/trunc2.img"
no_leftovers "$T/trunc2.img" "clone of a truncated image"
# a superblock claiming 2^46 blocks: its backup superblocks would land petabytes past the end
cp "$T/g.img" "$T/huge.img"
printf 'ssv blocks_count 0x400000000000\nssv inodes_per_group 1\nssv inodes_count 0x80000000\n' >"$T/ssv"
debugfs -w -f "$T/ssv" "$T/huge.img" >/dev/null 2>&1
expect_fail "clone --new-uuid of an image with a lying superblock" "$VMSNAP" disk clone --new-uuid "$T/huge.img" "$T/huge2.img"
no_leftovers "$T/huge2.img" "clone of a lying superblock"
expect_fail "info of an image with a lying superblock" "$VMSNAP" disk info "$T/huge.img"
# a block count whose size in bytes wraps around 2^64 (bigalloc lets libext2fs accept it)
truncate -s 64M "$T/wrap.img"
mke2fs -q -F -t ext4 -b 4096 -O bigalloc,64bit,sparse_super2,^metadata_csum,^has_journal,^resize_inode,^uninit_bg \
    -C 65536 "$T/wrap.img"
printf '%s\n' 'ssv log_cluster_size 18' 'ssv blocks_per_group 2147483648' 'ssv clusters_per_group 32768' \
    'ssv inodes_per_group 16' 'ssv inodes_count 33554448' 'ssv blocks_count 4503599627370512' \
    'ssv free_blocks_count 0' 'ssv free_inodes_count 0' 'ssv backup_bgs[0] 1' 'ssv backup_bgs[1] 0' >"$T/ssv"
debugfs -w -f "$T/ssv" "$T/wrap.img" >/dev/null 2>&1
truncate -s 1M "$T/wrap.img"
expect_fail "info of an image whose size wraps 2^64" "$VMSNAP" disk info "$T/wrap.img"
grep -q "claims 45035996273705[0-9]* blocks of 4096 bytes but the image holds 1048576" "$T/err" || fail "wrapping size: $(cat "$T/err")"
expect_fail "clone --new-uuid of an image whose size wraps 2^64" "$VMSNAP" disk clone --new-uuid --force "$T/wrap.img" "$T/wrap2.img"
no_leftovers "$T/wrap2.img" "clone of a wrapping size"
cp "$T/g.img" "$T/free.img"
printf 'ssv free_blocks_count 0x7fffffff\n' >"$T/ssv"
debugfs -w -f "$T/ssv" "$T/free.img" >/dev/null 2>&1
expect_fail "info of an image with more free blocks than blocks" "$VMSNAP" disk info --json "$T/free.img"
grep -q "corrupt superblock" "$T/err" || fail "free > total: $(cat "$T/err")"
# --from-dir holding the destination: the image does not copy its own temporary file
mkdir "$T/self" && echo x >"$T/self/a"
"$VMSNAP" disk create --size 64M --from-dir "$T/self" "$T/self/out.img" || fail "create into its --from-dir"
debugfs -R 'ls /' "$T/self/out.img" 2>/dev/null | grep -q 'out\.img' && fail "the image holds its own temporary file"
debugfs -R 'ls /' "$T/self/out.img" 2>/dev/null | grep -q ' a ' || fail "the image lacks its --from-dir file"
# a directory in the way is refused before any work, even with --force
mkdir "$T/adir"
expect_fail "create over a directory" "$VMSNAP" disk create --force --size 64M "$T/adir"
grep -q "is a directory" "$T/err" || fail "create over a directory: $(cat "$T/err")"
# libext2fs's own words for its errors, not a number alone
expect_fail "more inodes than 64M can hold" "$VMSNAP" disk create --size 64M --inodes 1000000 "$T/ino.img"
grep -q "requested number of inodes" "$T/err" || fail "too many inodes: unclear error: $(cat "$T/err")"
# a label is bytes from the image: printed without terminal escapes
"$VMSNAP" disk create --size 64M --label "$(printf 'a\033[31mb')" "$T/lab.img" || fail "create with a label"
"$VMSNAP" disk info "$T/lab.img" | grep -q "$(printf '\033')" && fail "disk info printed an escape from the label"
# ... a UTF-8 label as it is (each byte >= 0x80 was a '?'), one that is not UTF-8 (an 8-bit
# CSI, 0x9b) escaped as \xHH in the text and in the JSON, which stays valid UTF-8 (it went raw)
"$VMSNAP" disk create --size 64M --label "$(printf 'h\303\251llo')" "$T/lab2.img" || fail "create with a UTF-8 label"
"$VMSNAP" disk info "$T/lab2.img" | grep -q "^label: *$(printf 'h\303\251llo')\$" || fail "UTF-8 label: $("$VMSNAP" disk info "$T/lab2.img" | grep label)"
"$VMSNAP" disk create --size 64M --label "$(printf '\377\2332J')" "$T/lab3.img" || fail "create with a non-UTF-8 label"
"$VMSNAP" disk info "$T/lab3.img" | grep -q '^label: *\\xff\\x9b2J$' || fail "non-UTF-8 label: $("$VMSNAP" disk info "$T/lab3.img" | grep label | od -c | head -3)"
"$VMSNAP" disk info --json "$T/lab3.img" >"$T/lab3.json"
python3 -c 'import json,sys; l=json.loads(open(sys.argv[1],"rb").read().decode("utf-8"))["label"]; sys.exit(l != "\\xff\\x9b2J")' "$T/lab3.json" ||
    fail "disk info --json of a non-UTF-8 label: $(od -c "$T/lab3.json" | head -5)"
# a source tree deeper than 1000 directories: refused (the copy recurses per level)
deep() { python3 -c 'import os,sys
os.mkdir(sys.argv[1]); os.chdir(sys.argv[1])
for _ in range(int(sys.argv[2])): os.mkdir("d"); os.chdir("d")' "$@"; }
deep "$T/deep" 1100
expect_fail "a 1100-deep tree" "$VMSNAP" disk create --size 64M --from-dir "$T/deep" "$T/deep.img"
grep -q "more than 1000 directories deep" "$T/err" || fail "deep tree: $(cat "$T/err")"
no_leftovers "$T/deep.img" "deep tree"
deep "$T/deep900" 900
"$VMSNAP" disk create --size 64M --from-dir "$T/deep900" "$T/deep900.img" || fail "a 900-deep tree"
e2fsck -fn "$T/deep900.img" >"$T/fsck" 2>&1 || fail "900-deep: e2fsck: $(tail "$T/fsck")"
# more hard links to one file than ext4 allows (65,000; tmpfs has no such limit)
if [ "$(id -u)" = 0 ] && mkdir -p "$T/hl" && mount -t tmpfs -o size=64m tmpfs "$T/hl"; then
    python3 -c '
import os, sys
d = sys.argv[1]
open(os.path.join(d, "f"), "w").close()
for i in range(65001):
    os.link(os.path.join(d, "f"), os.path.join(d, "l%d" % i))' "$T/hl"
    expect_fail "65,002 hard links to one file" "$VMSNAP" disk create --size 256M --inodes 70000 \
        --from-dir "$T/hl" "$T/hl.img"
    grep -q "more than 65000 hard links" "$T/err" || fail "too many links: $(cat "$T/err")"
    no_leftovers "$T/hl.img" "too many links"
    umount "$T/hl"
else
    echo "note: the hard-link limit case needs root to mount a tmpfs; not run" >&2
    [ "${VMSNAP_REQUIRE_ALL:-0}" = 1 ] && fail "hard-link limit case could not run"
fi
# --add with its own mode/owner of a file hard-linked to another name in the image: each name
# keeps what it was given (they shared one inode, the first one's: a key added 0600 was 0644)
if command -v debugfs >/dev/null; then
    mkdir -p "$T/hlt/tree" && echo secret >"$T/hlt/tree/key" && chmod 644 "$T/hlt/tree/key" &&
        ln "$T/hlt/tree/key" "$T/hlt/key.hl"
    "$VMSNAP" disk create --size 16M --from-dir "$T/hlt/tree" --add "$T/hlt/key.hl:/secret:0600:0:0" \
        --add "$T/hlt/tree/key:/other:0400:1000:1000" "$T/hlt.img" || fail "create with linked --add"
    e2fsck -fn "$T/hlt.img" >/dev/null 2>&1 || fail "linked --add: e2fsck"
    for spec in "/key 644 0" "/secret 600 0" "/other 400 1000"; do
        set -- $spec
        out=$(debugfs -R "stat $1" "$T/hlt.img" 2>/dev/null)
        mode=$(printf '%s\n' "$out" | sed -n 's/.*Mode: *0*\([0-7]*\).*/\1/p' | head -1)
        uid=$(printf '%s\n' "$out" | sed -n 's/.*User: *\([0-9]*\).*/\1/p' | head -1)
        [ "$mode" = "$2" ] && [ "$uid" = "$3" ] ||
            fail "linked --add: $1 has mode $mode uid $uid, want $2 uid $3"
    done
fi

# A source file written while it is copied fails the create, naming it (it went into the image
# as it never was: the bytes read before a truncation, then zeros). The shim truncates it at
# the first read of its data.
if "${CC:-cc}" -shared -fPIC -o "$T/grow.so" "$SRC/tests/shims/pread_change.c" -ldl 2>"$T/err"; then
    mkdir -p "$T/chg" && head -c 3000000 /dev/urandom >"$T/chg/f"
    SHIM_ACT=truncate SHIM_FILE="$T/chg/f" LD_PRELOAD="$T/grow.so" \
        ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" \
        "$VMSNAP" disk create --size 64M --from-dir "$T/chg" "$T/chg.img" 2>"$T/err" &&
        fail "a source file truncated while copied: create succeeded"
    [ "$(stat -c %s "$T/chg/f")" = 1000 ] || fail "changed source: the shim did not run"
    grep -q "chg/f changed while being copied" "$T/err" || fail "changed source: $(cat "$T/err")"
    no_leftovers "$T/chg.img" "changed source"
elif [ "${VMSNAP_REQUIRE_ALL:-0}" = 1 ]; then
    fail "cannot build the LD_PRELOAD shim: $(cat "$T/err")"
fi
# A crafted geometry (8 blocks per group, no sparse_super) in a sparse file: a new UUID would
# write a superblock every 32 KiB of the claimed 2 GiB (256 MiB allocated); refused
"$VMSNAP" disk create --size 8M "$T/craft.img" || fail "create for the crafted geometry"
python3 - "$T/craft.img" $((2 << 30)) 8 <<'PYEOF'
import struct, sys
def crc32c(data, crc=0xFFFFFFFF):
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc
path, size, bpg = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(path, "r+b") as f:
    f.seek(1024)
    sb = bytearray(f.read(1024))
    bs = 1024 << struct.unpack_from("<I", sb, 24)[0]
    blocks = size // bs
    groups = (blocks + bpg - 1) // bpg
    struct.pack_into("<I", sb, 0, groups)  # inodes: one per group
    struct.pack_into("<I", sb, 4, blocks & 0xFFFFFFFF)
    struct.pack_into("<I", sb, 0x150, blocks >> 32)
    for off in (12, 0x158, 16):  # free blocks (lo, hi), free inodes
        struct.pack_into("<I", sb, off, 0)
    for off, v in ((32, bpg), (36, bpg), (40, 1)):  # blocks, clusters, inodes per group
        struct.pack_into("<I", sb, off, v)
    struct.pack_into("<I", sb, 0x64, struct.unpack_from("<I", sb, 0x64)[0] & ~1)  # ^sparse_super
    struct.pack_into("<I", sb, 0x3FC, crc32c(bytes(sb[:0x3FC])))
    f.seek(1024)
    f.write(sb)
    f.truncate(size)
PYEOF
expect_fail "--new-uuid of a crafted geometry" "$VMSNAP" disk clone --new-uuid "$T/craft.img" "$T/craft2.img"
grep -q "superblock copies to rewrite" "$T/err" || fail "crafted geometry: $(cat "$T/err")"
no_leftovers "$T/craft2.img" "crafted geometry"
rm -f "$T/craft.img"

# sizes: 0 is a usage error (it made a 4 GiB image), a small one is named as given, 16 TiB and
# more is refused clearly (libext2fs said "invalid argument"); --inodes past ext4's limit
rc=0 && "$VMSNAP" disk create --size 0 "$T/sz.img" 2>"$T/err" || rc=$?
[ "$rc" = 2 ] && [ ! -e "$T/sz.img" ] || fail "--size 0: exit $rc: $(cat "$T/err")"
# an empty path is a usage error before any work (a clone copied the whole image, then failed
# renaming onto '')
"$VMSNAP" disk create --size 64M "$T/e.img" || fail "create e.img"
for c in "disk create --size 64M ''" "disk clone '$T/e.img' ''" "disk clone '' '$T/e2.img'"; do
    rc=0 && eval "\"\$VMSNAP\" $c" 2>"$T/err" || rc=$?
    [ "$rc" = 2 ] || fail "$c: exit $rc: $(cat "$T/err")"
done
ls -A "$T" | grep -q '^\.e\.img\.\|^\.\.' && fail "an empty DST left a temporary: $(ls -A "$T")"
rm -f "$T/e.img"
# out of range and too long a label: usage errors (exit 2, they were 1), before anything is made
for a in "--size 1K" "--size 16T" "--label 12345678901234567"; do
    rc=0 && "$VMSNAP" disk create $a "$T/sz.img" 2>"$T/err" || rc=$?
    [ "$rc" = 2 ] && [ ! -e "$T/sz.img" ] || fail "$a: exit $rc: $(cat "$T/err")"
done
grep -q "longer than 16 bytes" "$T/err" || fail "--label: $(cat "$T/err")"
no_leftovers "$T/sz.img" "--size 16T"
rc=0 && "$VMSNAP" disk create --inodes 4294967295 "$T/sz.img" 2>"$T/err" || rc=$?
[ "$rc" = 2 ] || fail "--inodes 4294967295: exit $rc: $(cat "$T/err")"
rc=0 && "$VMSNAP" disk create --add "$T/nope:/a:zz" "$T/sz.img" 2>"$T/err" || rc=$?
[ "$rc" = 2 ] && grep -q "in '$T/nope:/a:zz'" "$T/err" || fail "bad --add mode: exit $rc: $(cat "$T/err")"

# extended attributes are not copied (known gap): said, naming the first file, not silently
mkdir -p "$T/xa" && echo x >"$T/xa/f"
if python3 -c 'import os, sys; os.setxattr(sys.argv[1], "user.vmsnap", b"1")' "$T/xa/f" 2>/dev/null; then
    "$VMSNAP" disk create --size 16M --from-dir "$T/xa" "$T/xa.img" 2>"$T/err" || fail "create with xattrs: $(cat "$T/err")"
    grep -q "1 source file has extended attributes .* not copied (the first: $T/xa/f)" "$T/err" ||
        fail "xattrs dropped without a word: $(cat "$T/err")"
    rm -f "$T/xa.img"
fi

done_tests
