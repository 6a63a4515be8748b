#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# disk create --from-dir/--add/--mkdir: e2fsck -fn clean on every image; the kernel sees the
# same tree (bytes, modes, owners, symlink targets, mtimes, hard links, holes) through a
# read-only loop mount; the kernel mounts it read-write, writes, unmounts, e2fsck stays clean;
# debugfs rdump gives back the same bytes (a peer reader that is not the kernel).
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/lib.sh"
PY="python3 $SRC/tests/integration/disk_tree.py"
command -v e2fsck >/dev/null && command -v debugfs >/dev/null || skip "e2fsprogs not installed"
[ "$(id -u)" = 0 ] || skip "needs root for loop mounts and chown"
losetup -f >/dev/null 2>&1 || skip "no free loop device"

MNT=$T/mnt
mkdir -p "$MNT"
at_exit 'mountpoint -q "$MNT" && umount "$MNT"'

fsck_clean() { # IMAGE DESC
    if ! e2fsck -fn "$1" >"$T/fsck" 2>&1; then
        fail "$2: e2fsck -fn not clean: $(tail -20 "$T/fsck")"
        return 1
    fi
}

# 1. empty image: clean, inode tables are holes (4 GiB image, well under 1 MiB allocated)
"$VMSNAP" disk create "$T/empty.img" || fail "create empty"
fsck_clean "$T/empty.img" empty
alloc=$(allocated "$T/empty.img")
[ "$alloc" -lt $((1024 * 1024)) ] || fail "empty 4 GiB image allocates $alloc bytes (want < 1 MiB)"
[ "$(stat -c %s "$T/empty.img")" = $((4 << 30)) ] || fail "default size is not 4 GiB"
"$VMSNAP" disk info --json "$T/empty.img" >"$T/info.json" || fail "info"
python3 - "$T/info.json" <<'PYEOF' || fail "info --json fields"
import json, sys
j = json.load(open(sys.argv[1]))
feats = set(j["features"])
need = {"extent", "64bit", "flex_bg", "huge_file", "dir_nlink", "extra_isize", "metadata_csum",
        "metadata_csum_seed", "dir_index"}
assert need <= feats, need - feats
assert "has_journal" not in feats
assert j["clean"] is True and j["logical_bytes"] == 4 << 30 and j["inodes_used"] == 11, j
PYEOF
dumpe2fs "$T/empty.img" >"$T/dump" 2>/dev/null
groups=$(grep -c '^Group [0-9]' "$T/dump")
zeroed=$(grep -c '^Group [0-9].*ITABLE_ZEROED' "$T/dump")
[ "$groups" -gt 1 ] && [ "$zeroed" = "$groups" ] || fail "$zeroed of $groups groups marked ITABLE_ZEROED"

# 2. random trees (255-byte names, 40-deep dirs, sparse files, fast/slow symlinks, hard links)
for seed in 1 2; do
    rm -rf "$T/src"
    $PY make "$T/src" $seed --files 600 --deep 40
    img=$T/tree$seed.img
    "$VMSNAP" disk create --size 512M --label tree$seed --from-dir "$T/src" "$img" || {
        fail "create from random tree $seed"
        continue
    }
    fsck_clean "$img" "tree $seed"
    mount -o loop,ro "$img" "$MNT"
    $PY compare "$T/src" "$MNT" || fail "tree $seed: kernel view differs from the source"
    umount "$MNT"
    # debugfs rdump as a second reader: same bytes
    rm -rf "$T/rd" && mkdir "$T/rd"
    debugfs -R "rdump / $T/rd" "$img" >/dev/null 2>&1 || fail "debugfs rdump"
    if ! diff -r --no-dereference "$T/src" "$T/rd/" -x lost+found >"$T/diff" 2>&1; then
        fail "tree $seed: debugfs rdump differs: $(head -5 "$T/diff")"
    fi
done

# 3. --add/--mkdir on top of --from-dir; owners and modes from the command line
mkdir -p "$T/seed"
echo "nameserver 10.0.0.1" >"$T/resolv.conf"
echo "10.0.0.2 vm" >"$T/hosts"
ln -s /proc/self/mounts "$T/mtab"
"$VMSNAP" disk create --size 64M --from-dir "$T/seed" --add "$T/resolv.conf:/etc/resolv.conf:0600:1:2" \
    --add "$T/hosts:/etc/hosts" --add "$T/mtab:/etc/mtab" --mkdir /var/tmp:1777 \
    --mkdir /home/u:0700:1000:1000 "$T/seeded.img" || fail "create seeded"
fsck_clean "$T/seeded.img" seeded
mount -o loop,ro "$T/seeded.img" "$MNT"
[ "$(cat "$MNT/etc/resolv.conf")" = "nameserver 10.0.0.1" ] || fail "resolv.conf bytes"
[ "$(stat -c '%a %u %g' "$MNT/etc/resolv.conf")" = "600 1 2" ] || fail "resolv.conf mode/owner: $(stat -c '%a %u %g' "$MNT/etc/resolv.conf")"
[ "$(readlink "$MNT/etc/mtab")" = /proc/self/mounts ] || fail "mtab symlink"
[ "$(stat -c '%a' "$MNT/var/tmp")" = 1777 ] || fail "/var/tmp mode"
[ "$(stat -c '%a %u %g' "$MNT/home/u")" = "700 1000 1000" ] || fail "/home/u mode/owner"
[ "$(stat -c '%Y' "$MNT/etc/hosts")" = "$(stat -c '%Y' "$T/hosts")" ] || fail "hosts mtime"
umount "$MNT"
# --mkdir / with a mode and owner applies them to the root (it used to be ignored)
"$VMSNAP" disk create --size 64M --mkdir /:0700:5:6 --mkdir /x "$T/root.img" || fail "create with --mkdir /"
fsck_clean "$T/root.img" "--mkdir /"
mount -o loop,ro "$T/root.img" "$MNT"
[ "$(stat -c '%a %u %g' "$MNT")" = "700 5 6" ] || fail "--mkdir /: root is $(stat -c '%a %u %g' "$MNT")"
[ -d "$MNT/lost+found" ] && [ -d "$MNT/x" ] || fail "--mkdir /: root entries: $(ls -a "$MNT")"
umount "$MNT"

# 4. the kernel mounts it read-write, writes, unmounts, e2fsck stays clean
mount -o loop "$T/tree1.img" "$MNT"
mkdir "$MNT/new"
for i in $(seq 1 200); do echo "$i" >"$MNT/new/f$i"; done
head -c 5000000 /dev/urandom >"$MNT/new/big"
rm -rf "$MNT/d000/d001"
ln -s big "$MNT/new/link"
umount "$MNT"
fsck_clean "$T/tree1.img" "after kernel read-write use"
"$VMSNAP" disk info "$T/tree1.img" >"$T/info" || fail "info after unmount"
grep -q "state: *clean" "$T/info" || fail "info: not clean after unmount"

# 5. refused inputs: other file types, existing destination, missing source, bad paths
mkdir -p "$T/fifo"
mkfifo "$T/fifo/p"
expect_fail "fifo refused" "$VMSNAP" disk create --size 16M --from-dir "$T/fifo" "$T/fifo.img"
grep -q "FIFO" "$T/err" || fail "fifo: error does not name the type: $(cat "$T/err")"
[ ! -e "$T/fifo.img" ] || fail "fifo: image left behind"
expect_fail "existing destination" "$VMSNAP" disk create --size 16M "$T/empty.img"
grep -q "exists" "$T/err" || fail "existing: error unclear: $(cat "$T/err")"
"$VMSNAP" disk create --force --size 16M "$T/empty.img" || fail "--force replace"
[ "$(stat -c %s "$T/empty.img")" = $((16 << 20)) ] || fail "--force did not replace"
expect_fail "missing source" "$VMSNAP" disk create --size 16M --add "$T/nope:/x" "$T/m.img"
grep -q "$T/nope" "$T/err" || fail "missing source not named: $(cat "$T/err")"
expect_fail "missing from-dir" "$VMSNAP" disk create --size 16M --from-dir "$T/nodir" "$T/m.img"
expect_fail "duplicate dest" "$VMSNAP" disk create --size 16M --add "$T/hosts:/etc/hosts" \
    --add "$T/hosts:/etc/hosts" "$T/m.img"
[ ! -e "$T/m.img" ] || fail "failed creates left an image"
ls -a "$T" | grep -q '^\.m\.img\.' && fail "temporary file left behind"
rc=0
"$VMSNAP" disk create --add "$T/hosts" "$T/m.img" 2>/dev/null || rc=$?
[ "$rc" = 2 ] || fail "malformed --add: exit $rc, want 2"
done_tests
