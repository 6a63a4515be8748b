#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# disk clone: on ext4 (no reflinks) the extent walk gives the same bytes and the same
# allocation (holes kept) and writing the clone leaves the source unchanged; on loop-mounted
# XFS (reflink=1) and btrfs the clone uses FICLONE and takes no extra space; --new-uuid
# changes the UUID and e2fsck stays clean (and is refused without metadata_csum_seed unless
# --force); --link makes a hard link.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/lib.sh"
command -v e2fsck >/dev/null || skip "e2fsprogs not installed"
[ "$(id -u)" = 0 ] || skip "needs root for loop mounts"
command -v mkfs.xfs >/dev/null || skip "xfsprogs not installed"
command -v mkfs.btrfs >/dev/null || skip "btrfs-progs not installed"
losetup -f >/dev/null 2>&1 || skip "no free loop device"

MNT=$T/mnt
mkdir -p "$MNT"
at_exit 'for m in "$MNT" "$T/xfs" "$T/btrfs"; do mountpoint -q "$m" && umount "$m"; done'

uuid_of() { "$VMSNAP" disk info --json "$1" | jget - 'j["uuid"]'; }

# A seeded image with 20 MiB of data in a 1 GiB virtual size, where this filesystem (ext4 on
# the test machine) has no reflinks.
mkdir -p "$T/seed"
head -c $((20 << 20)) /dev/urandom >"$T/seed/data"
echo hi >"$T/seed/small"
"$VMSNAP" disk create --size 1G --from-dir "$T/seed" "$T/src.img"
# an upper disk holds a tenant's files: readable by its owner only (it was 0644)
[ "$(stat -c %a "$T/src.img")" = 600 ] || fail "disk create: mode $(stat -c %a "$T/src.img"), expected 600"
src_sum=$(md5sum <"$T/src.img")
fstype=$(stat -f -c %T "$T")

"$VMSNAP" -v disk clone "$T/src.img" "$T/c1.img" 2>"$T/how" || fail "clone"
cmp -s "$T/src.img" "$T/c1.img" || fail "clone bytes differ"
[ "$(stat -c %s "$T/c1.img")" = "$(stat -c %s "$T/src.img")" ] || fail "clone size differs"
a=$(allocated "$T/src.img") b=$(allocated "$T/c1.img")
if grep -q ficlone "$T/how"; then
    echo "note: $fstype supports FICLONE here"
else
    # same allocation, give or take the file's own extent-tree blocks
    [ "$b" -le $((a + 65536)) ] && [ "$b" -ge $((a - 65536)) ] ||
        fail "clone allocates $b bytes, source $a (holes not kept?)"
fi
# writing the clone (through the kernel) leaves the source unchanged
mount -o loop "$T/c1.img" "$MNT"
echo changed >"$MNT/small"
head -c 1000000 /dev/urandom >"$MNT/new"
umount "$MNT"
[ "$(md5sum <"$T/src.img")" = "$src_sum" ] || fail "writing the clone changed the source"
e2fsck -fn "$T/c1.img" >"$T/fsck" 2>&1 || fail "written clone: e2fsck: $(tail "$T/fsck")"

# --direct: O_DIRECT between tmpfs (where guest RAM lives) and this filesystem, both ways: same
# bytes, holes kept, and neither the written nor the read file left in the page cache (only an
# unaligned tail page goes through the buffered path). Cache is checked before cmp reads them.
SHM=$(mktemp -d /dev/shm/vmsnap-dclone.XXXXXX)
at_exit 'rm -rf "$SHM"'
python3 - "$SHM/ram" <<'PYEOF'
import os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
for off, n in ((0, 1 << 20), (5 << 20, 4096), (9 << 20, 12345), (20 << 20, (9 << 20) + 123)):
    os.pwrite(fd, os.urandom(n), off)
os.ftruncate(fd, (40 << 20) + 1234)
os.pwrite(fd, os.urandom(2000), (40 << 20) - 766)  # data up to the unaligned end
PYEOF
"$VMSNAP" -v disk clone --direct "$SHM/ram" "$T/d1.img" 2>"$T/how" || fail "clone --direct to disk"
[ "$fstype" = tmpfs ] || grep -q direct "$T/how" || fail "--direct: method not reported: $(cat "$T/how")"
n=$(cached_pages "$T/d1.img")
[ "$n" -le 2 ] || fail "--direct left $n pages of the written copy cached"
"$VMSNAP" disk clone --direct "$T/d1.img" "$SHM/back" || fail "clone --direct from disk"
n=$(cached_pages "$T/d1.img")
[ "$n" -le 2 ] || fail "--direct read left $n pages of the source cached"
cmp -s "$SHM/ram" "$T/d1.img" && cmp -s "$SHM/ram" "$SHM/back" || fail "--direct copies differ"
a=$(allocated "$SHM/ram") b=$(allocated "$T/d1.img") c=$(allocated "$SHM/back")
[ "$b" -le $((a + 65536)) ] && [ "$c" -le $((a + 65536)) ] ||
    fail "--direct copies allocate $b / $c bytes, source $a (holes not kept?)"

# --direct into a filesystem that fills up: a clear error naming the source, nothing left behind
truncate -s 24M "$T/small.fs" && mke2fs -q -t ext4 -O ^has_journal "$T/small.fs" &&
    mount -o loop "$T/small.fs" "$MNT" || fail "cannot mount a small ext4"
head -c $((40 << 20)) /dev/urandom >"$SHM/big"
expect_fail "--direct into a full filesystem" "$VMSNAP" disk clone --direct "$SHM/big" "$MNT/c.img"
grep -q "$SHM/big" "$T/err" && grep -qi "no space" "$T/err" || fail "disk full: unclear error: $(cat "$T/err")"
[ -z "$(ls -A "$MNT" | grep -v lost+found)" ] || fail "disk full: left $(ls -A "$MNT")"
umount "$MNT"
rm -f "$SHM/big"

# --new-uuid: a new UUID, e2fsck clean, only superblocks differ from the source
"$VMSNAP" disk clone --new-uuid "$T/src.img" "$T/c2.img" || fail "clone --new-uuid"
u1=$(uuid_of "$T/src.img") u2=$(uuid_of "$T/c2.img")
[ -n "$u2" ] && [ "$u1" != "$u2" ] || fail "--new-uuid kept the UUID ($u1 / $u2)"
e2fsck -fn "$T/c2.img" >"$T/fsck" 2>&1 || fail "--new-uuid: e2fsck: $(tail "$T/fsck")"
ndiff=$( (cmp -l "$T/src.img" "$T/c2.img" || true) | awk '{ print int(($1 - 1) / 4096) }' | sort -u | wc -l)
nsb=$(dumpe2fs "$T/src.img" 2>/dev/null | grep -c "superblock at")
[ "$ndiff" = "$nsb" ] || fail "--new-uuid changed $ndiff blocks, want only the $nsb superblocks"
mount -o loop,ro "$T/c2.img" "$MNT" && cmp -s "$MNT/data" "$T/seed/data" || fail "--new-uuid clone unreadable"
umount "$MNT" 2>/dev/null || true

# metadata checksums without metadata_csum_seed (mke2fs 1.47's default ext4): refused unless --force
mke2fs -q -t ext4 -O ^metadata_csum_seed,^has_journal "$T/plain.img" 64M
expect_fail "--new-uuid without csum seed" "$VMSNAP" disk clone --new-uuid "$T/plain.img" "$T/c3.img"
grep -q "metadata_csum_seed" "$T/err" || fail "refusal does not name the feature: $(cat "$T/err")"
[ ! -e "$T/c3.img" ] || fail "refused clone left a file"
"$VMSNAP" disk clone --new-uuid --force "$T/plain.img" "$T/c3.img" || fail "--new-uuid --force"
e2fsck -fn "$T/c3.img" >"$T/fsck" 2>&1 || fail "--force uuid: e2fsck: $(tail "$T/fsck")"
[ "$(uuid_of "$T/plain.img")" != "$(uuid_of "$T/c3.img")" ] || fail "--force: UUID unchanged"
grep -q "c3.img: metadata checksums without" "$T/err" && ! grep -q '\.c3\.img\.' "$T/err" ||
    fail "refusal names the temporary file, not the destination: $(cat "$T/err")"
# without metadata checksums at all nothing depends on the UUID: no --force needed
mke2fs -q -t ext4 -O ^metadata_csum,^metadata_csum_seed,^has_journal,^uninit_bg "$T/nocsum.img" 64M
"$VMSNAP" disk clone --new-uuid "$T/nocsum.img" "$T/c4.img" 2>"$T/err" || fail "--new-uuid without checksums: $(cat "$T/err")"
e2fsck -fn "$T/c4.img" >"$T/fsck" 2>&1 || fail "no-csum uuid: e2fsck: $(tail "$T/fsck")"
[ "$(uuid_of "$T/nocsum.img")" != "$(uuid_of "$T/c4.img")" ] || fail "no-csum: UUID unchanged"

# a destination that appears while a copy runs (no --force) is kept and the clone fails: the
# rename at the end replaced it
VMSNAP_FAILPOINT=disk-clone-copied:stop "$VMSNAP" disk clone "$T/src.img" "$T/appear.img" 2>"$T/aerr" &
apid=$!
wait_stopped $apid 30 || fail "the clone did not stop after its copy: $(cat "$T/aerr")"
echo precious >"$T/appear.img"
kill -CONT $apid
rc=0 && wait $apid || rc=$?
[ $rc = 1 ] || fail "clone onto a destination that appeared meanwhile: exit $rc: $(cat "$T/aerr")"
grep -q "appear.img appeared while this ran" "$T/aerr" || fail "clone onto a file that appeared: $(cat "$T/aerr")"
[ "$(cat "$T/appear.img")" = precious ] || fail "the clone replaced a file that appeared meanwhile"
ls -A "$T" | grep -q '^\.appear' && fail "the refused clone left its temporary: $(ls -A "$T")"
rm -f "$T/appear.img"
# a read-only image of its owner (not root) clones with --new-uuid: the copy was made with the
# image's mode at once and could not be reopened to patch the UUID (EACCES)
if id nobody >/dev/null 2>&1 && command -v setpriv >/dev/null; then
    mkdir "$T/ro" && chmod 711 "$T"
    "$VMSNAP" disk create --size 64M "$T/ro/r.img" || fail "create r.img"
    chmod 444 "$T/ro/r.img" && chown -R nobody "$T/ro"
    setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups \
        "$VMSNAP" disk clone --new-uuid "$T/ro/r.img" "$T/ro/c.img" 2>"$T/err" ||
        fail "clone --new-uuid of a read-only image by its owner: $(cat "$T/err")"
    [ "$(stat -c %a "$T/ro/c.img")" = 444 ] || fail "the clone's mode: $(stat -c %a "$T/ro/c.img")"
    [ "$(uuid_of "$T/ro/r.img")" != "$(uuid_of "$T/ro/c.img")" ] || fail "read-only clone: UUID unchanged"
    e2fsck -fn "$T/ro/c.img" >"$T/fsck" 2>&1 || fail "read-only clone: e2fsck: $(tail "$T/fsck")"
    chmod 700 "$T"
else
    echo "note: no user nobody or no setpriv: the read-only clone as a user is not exercised"
fi

# --link: a hard link; existing destination refused without --force
"$VMSNAP" -v disk clone --link "$T/src.img" "$T/l.img" 2>"$T/how" || fail "clone --link"
[ "$(stat -c %i "$T/l.img")" = "$(stat -c %i "$T/src.img")" ] || fail "--link did not link"
grep -q link "$T/how" || fail "--link: method not reported"
# a symlink as SRC: the image it names is linked, not the symlink (a relative one dangled from
# DST's directory, or named another image there), with and without --force
ln -s src.img "$T/sym.img" && mkdir -p "$T/lsub"
for f in "" --force; do
    rm -f "$T/lsub/out.img" && "$VMSNAP" disk clone --link $f "$T/sym.img" "$T/lsub/out.img" ||
        fail "clone --link $f of a symlink"
    [ ! -L "$T/lsub/out.img" ] && [ "$(stat -c %i "$T/lsub/out.img")" = "$(stat -c %i "$T/src.img")" ] ||
        fail "clone --link $f of a symlink did not link the image it names"
done
rm -f "$T/lsub/out.img" "$T/sym.img"
# --link --force replaces only a regular file (a FIFO or a link at DST went, as a copy refuses)
mkfifo "$T/lfifo" && ln -s "$T/nothere" "$T/llnk"
for d in lfifo llnk; do
    expect_fail "clone --link --force over a $d" "$VMSNAP" disk clone --link --force "$T/src.img" "$T/$d"
    grep -q "$T/$d is a .*, not a file: not replaced" "$T/err" || fail "--link over a $d: $(cat "$T/err")"
done
[ -p "$T/lfifo" ] && [ -L "$T/llnk" ] || fail "clone --link --force replaced a FIFO or a link"
rm -f "$T/lfifo" "$T/llnk"
expect_fail "existing destination" "$VMSNAP" disk clone "$T/src.img" "$T/c1.img"
grep -q -- "--force" "$T/err" || fail "existing destination: unclear error"
"$VMSNAP" disk clone --force "$T/src.img" "$T/c1.img" || fail "clone --force"
cmp -s "$T/src.img" "$T/c1.img" || fail "clone --force: bytes"
expect_fail "missing source" "$VMSNAP" disk clone "$T/none.img" "$T/c4.img"
grep -q "none.img" "$T/err" || fail "missing source not named"

# FICLONE on reflink filesystems: the clone takes no extra space
for fs in xfs btrfs; do
    truncate -s 600M "$T/$fs.fs"
    if [ $fs = xfs ]; then mkfs.xfs -q -m reflink=1 "$T/$fs.fs"; else mkfs.btrfs -q "$T/$fs.fs" >/dev/null; fi
    mkdir -p "$T/$fs"
    mount -o loop "$T/$fs.fs" "$T/$fs"
    cp --sparse=always "$T/src.img" "$T/$fs/src.img"
    sync -f "$T/$fs/src.img"
    before=$(df -B1 --output=used "$T/$fs" | tail -1)
    "$VMSNAP" -v disk clone --new-uuid "$T/$fs/src.img" "$T/$fs/clone.img" 2>"$T/how" || fail "$fs: clone"
    sync -f "$T/$fs/clone.img"
    after=$(df -B1 --output=used "$T/$fs" | tail -1)
    grep -q ficlone "$T/how" || fail "$fs: FICLONE not used ($(cat "$T/how"))"
    [ $((after - before)) -lt $((2 << 20)) ] || fail "$fs: clone used $((after - before)) bytes (data is 20 MiB)"
    e2fsck -fn "$T/$fs/clone.img" >"$T/fsck" 2>&1 || fail "$fs: clone e2fsck: $(tail "$T/fsck")"
    [ "$(md5sum <"$T/$fs/src.img")" = "$src_sum" ] || fail "$fs: source changed by the UUID patch"
    umount "$T/$fs"
done
done_tests
