#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# disk create at its limits: an image with exactly 65,536 inodes filled to the last one is
# e2fsck-clean; one entry more fails with "out of inodes" and the numbers; a file larger than
# the image fails with "out of space" and the numbers; neither leaves anything at the
# destination (nor a temporary file beside it).
. "$VMSNAP_SRC/tests/lib.sh"
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

# an existing image is left untouched by a failing --force create
"$VMSNAP" disk create --size 8M "$T/keep.img"
sum=$(md5sum <"$T/keep.img")
expect_fail "out of space over an existing image" "$VMSNAP" disk create --force --size 4M \
    --add "$T/big:/big" "$T/keep.img"
[ "$(md5sum <"$T/keep.img")" = "$sum" ] || fail "failed --force create changed the existing image"

# the largest file that fits does fit (no off-by-one in the accounting): fill to the brim
"$VMSNAP" disk create --size 16M --add "$T/big:/big" "$T/fits.img" || fail "6 MiB into 16 MiB"
e2fsck -fn "$T/fits.img" >"$T/fsck" 2>&1 || fail "fits: e2fsck: $(tail "$T/fsck")"
done_tests
