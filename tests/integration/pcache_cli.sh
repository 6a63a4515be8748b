#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# vmsnap cache stat/evict end to end: JSON stat accuracy, preserve mode leaves dirty pages and
# content, --staged removes single-link files only, keeps hard-linked and --preserve'd trees
# byte-identical (hashed), --wait with --kick-writeback drains dirty pages, and errors exit 1/2.
# The staged walk never deletes outside its tree or what is not ours alone: a symlink root
# (trailing slash too) is refused, a bind mount below the root is not entered, a link made during
# the eviction (forced by an LD_PRELOAD shim) keeps the content, a file open elsewhere or being
# executed is only evicted, a read-only mount is only evicted, unavailable leases are said once; a
# symlink loop, a FIFO or a device given as PATH exits 1. The last part needs root (mounts,
# setpriv); it is skipped otherwise.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/lib.sh"

mounts=()
umount_all() {
    local i
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
        umount "${mounts[i]}" 2>/dev/null || umount -l "${mounts[i]}" 2>/dev/null || true
    done
}
# Unmount before t_cleanup removes $T: rm -rf would descend into a bind mount.
at_exit umount_all

[ "$(stat -f -c %T "$T")" != tmpfs ] || skip "$T is tmpfs (no dirty page tracking); set TMPDIR"

head -c 8M /dev/urandom >"$T/a.img"
sync "$T/a.img"
"$VMSNAP" cache evict "$T/a.img" >/dev/null
cat "$T/a.img" >/dev/null
"$VMSNAP" cache stat --json "$T/a.img" >"$T/s.json"
[ "$(jget "$T/s.json" 'j["total"]["cached"]')" = 2048 ] || fail "read fully: not all 2048 pages cached: $(cat "$T/s.json")"
[ "$(jget "$T/s.json" 'j["files"][0]["method"]')" = cachestat ] || fail "stat method not cachestat"
"$VMSNAP" cache evict "$T/a.img" >"$T/ev.out"
grep -q '^dropped: 2048 pages' "$T/ev.out" || fail "evict report: $(cat "$T/ev.out")"
"$VMSNAP" cache stat --json "$T" >"$T/s.json"
[ "$(jget "$T/s.json" 'j["total"]["cached"] <= 2')" = True ] || fail "after evict still cached: $(cat "$T/s.json")"

# Dirty file: preserve mode leaves content and dirty pages; after sync they go.
head -c 4M /dev/urandom >"$T/d.img"
sum=$(sha256sum <"$T/d.img")
"$VMSNAP" cache evict "$T/d.img" >"$T/ev.out"
grep -q '^still dirty: 1 files' "$T/ev.out" || fail "dirty file not reported: $(cat "$T/ev.out")"
"$VMSNAP" cache stat --json "$T/d.img" >"$T/s.json"
[ "$(jget "$T/s.json" 'j["total"]["cached"]')" = 1024 ] || fail "preserve evict dropped dirty pages"
[ "$(sha256sum <"$T/d.img")" = "$sum" ] || fail "preserve evict changed content"
sync "$T/d.img"
"$VMSNAP" cache evict "$T/d.img" >/dev/null
[ "$(cached_pages "$T/d.img")" -le 2 ] \
    || fail "after sync, evict left pages"

# --wait + --kick-writeback: a dirty file ends clean and dropped in the foreground.
head -c 16M /dev/urandom >"$T/w.img"
"$VMSNAP" cache evict --kick-writeback --wait 10 "$T/w.img" >"$T/ev.out"
grep -q '^still dirty: 0 files' "$T/ev.out" || fail "--wait: $(cat "$T/ev.out")"
[ "$(cached_pages "$T/w.img")" -le 2 ] \
    || fail "--wait --kick-writeback left pages cached"

# --wait on a file being written all along: said on its own line (it counted as neither dirty
# nor anything: "still dirty: 0 files" while 144 pages were dirty)
python3 -c 'import sys, time
f = open(sys.argv[1], "ab", buffering=0)
for i in range(50):
    f.write(b"x" * 65536)
    time.sleep(0.1)' "$T/wlog" &
wpid=$!
# until the writer has written (python starts slowly on a loaded machine)
for _ in $(seq 300); do [ -s "$T/wlog" ] && break; sleep 0.1; done
"$VMSNAP" cache evict --wait 2 "$T/wlog" >"$T/ev.out" || fail "evict --wait of a file being written"
wait $wpid
grep -q '^written, replaced or removed during the wait (left alone): 1 files' "$T/ev.out" ||
    fail "evict --wait of a file being written: $(cat "$T/ev.out")"

# --staged: single link gone, hard-linked file kept with both links, preserved tree identical.
mkdir -p "$T/r/keep/sub" "$T/elsewhere"
head -c 2M /dev/urandom >"$T/r/mem.img"
head -c 2M /dev/urandom >"$T/r/linked.img"
ln "$T/r/linked.img" "$T/elsewhere/linked.img"
head -c 1M /dev/urandom >"$T/r/keep/ckpt.img"
head -c 1M /dev/urandom >"$T/r/keep/sub/disk.img"
(cd "$T/r" && find keep linked.img -type f | sort | xargs sha256sum) >"$T/before.sum"
"$VMSNAP" cache evict --staged --preserve "$T/r/keep" "$T/r" >"$T/ev.out" || fail "staged evict failed"
grep -q '^removed: 1 files (2.00 MiB' "$T/ev.out" || fail "staged report: $(cat "$T/ev.out")"
[ ! -e "$T/r/mem.img" ] || fail "single-link file not removed"
(cd "$T/r" && sha256sum --quiet -c "$T/before.sum") || fail "preserved/linked files changed"
[ "$(stat -c %h "$T/r/linked.img")" = 2 ] || fail "hard link lost"
cmp -s "$T/r/linked.img" "$T/elsewhere/linked.img" || fail "link content differs"

# A checkpoint writer renames a new file, or a new directory, onto a preserved path after the
# staged walk resolved it (the walk stops at a failpoint meanwhile): neither is removed.
mkdir -p "$T/rr/ck" "$T/rr/tmp/newdir" && head -c 1M /dev/urandom >"$T/rr/ck/mem" &&
    head -c 1M /dev/urandom >"$T/rr/tmp/mem.new" && head -c 1M /dev/urandom >"$T/rr/tmp/newdir/f" &&
    mkdir "$T/rr/keepdir" && echo old >"$T/rr/keepdir/f" && head -c 1M /dev/urandom >"$T/rr/gone"
sum_new=$(sha256sum <"$T/rr/tmp/mem.new") && sum_dir=$(sha256sum <"$T/rr/tmp/newdir/f")
VMSNAP_FAILPOINT=evict-preserved:stop "$VMSNAP" cache evict --staged --preserve "$T/rr/ck/mem" \
    --preserve "$T/rr/keepdir" "$T/rr" >"$T/ev.out" 2>"$T/err" &
pid=$!
wait_stopped $pid || fail "staged evict did not stop at evict-preserved"
mv "$T/rr/tmp/mem.new" "$T/rr/ck/mem" && rm -r "$T/rr/keepdir" && mv "$T/rr/tmp/newdir" "$T/rr/keepdir"
kill -CONT $pid
wait $pid || fail "staged evict with a renamed preserved path: $(cat "$T/err")"
[ "$(sha256sum <"$T/rr/ck/mem" 2>/dev/null)" = "$sum_new" ] ||
    fail "a file renamed onto a preserved path during a staged evict was removed"
[ "$(sha256sum <"$T/rr/keepdir/f" 2>/dev/null)" = "$sum_dir" ] ||
    fail "a directory renamed onto a preserved path during a staged evict lost its file"
[ ! -e "$T/rr/gone" ] || fail "the unpreserved file of that evict was not removed"

# Errors: a missing path exits 1 naming it; bad usage exits 2.
expect_fail "missing path" "$VMSNAP" cache stat "$T/nope"
grep -q "$T/nope" "$T/err" || fail "error does not name the path: $(cat "$T/err")"
expect_fail "missing preserve path" "$VMSNAP" cache evict --staged --preserve "$T/nope" "$T/r"
[ -e "$T/r/linked.img" ] || fail "a failed evict touched files"
rc=0; "$VMSNAP" cache evict --wait abc "$T/r" 2>/dev/null || rc=$?
[ "$rc" = 2 ] || fail "--wait abc: exit $rc, expected 2"
for w in 2h 1x 61m; do
    rc=0; "$VMSNAP" cache evict --wait $w "$T/r" 2>/dev/null || rc=$?
    [ "$rc" = 2 ] || fail "--wait $w: exit $rc, expected 2"
done
"$VMSNAP" -q cache evict --wait 0.1s "$T/r" || fail "--wait 0.1s refused"
rc=0; "$VMSNAP" cache frob 2>/dev/null || rc=$?
[ "$rc" = 2 ] || fail "unknown subcommand: exit $rc, expected 2"
rc=0; "$VMSNAP" cache stat 2>/dev/null || rc=$?
[ "$rc" = 2 ] || fail "stat without PATH: exit $rc, expected 2"

# A symlink loop, a FIFO, a device given as PATH: exit 1 naming it and why. Inside a tree they
# are skipped silently.
ln -s "$T/loop-b" "$T/loop-a"
ln -s "$T/loop-a" "$T/loop-b"
mkfifo "$T/fifo"
for args in "stat $T/loop-a" "evict $T/loop-a" "evict --staged $T/loop-a"; do
    # shellcheck disable=SC2086
    expect_fail "$args" "$VMSNAP" cache $args
    grep -q "loop-a: .*symbolic link" "$T/err" || fail "$args: $(cat "$T/err")"
done
for p in "$T/fifo" /dev/null; do
    for verb in stat evict "evict --staged"; do
        # shellcheck disable=SC2086
        expect_fail "$verb $p" "$VMSNAP" cache $verb "$p"
        grep -q "$p: not a regular file or directory" "$T/err" || fail "$verb $p: $(cat "$T/err")"
    done
done
mkdir "$T/sp"
mkfifo "$T/sp/fifo"
ln -s "$T/loop-a" "$T/sp/loop"
"$VMSNAP" cache evict --staged "$T/sp" >/dev/null 2>"$T/err" || fail "special files in a tree: $(cat "$T/err")"
[ -p "$T/sp/fifo" ] && [ -L "$T/sp/loop" ] || fail "special files in a tree were touched"

# A symlink as the --staged root is refused, with or without a trailing slash; its target is
# left alone. Preserve mode follows it and modifies nothing.
mkdir -p "$T/target"
echo precious >"$T/target/keep"
ln -s "$T/target" "$T/lnk"
mkdir -p "$T/target/sub"
ln -s "$T/target/sub" "$T/lnk2" # lnk2/.. is target, reached through the link
for p in "$T/lnk/" "$T/lnk//" "$T/lnk" "$T/lnk/." "$T/lnk/./" "$T/lnk/./." "$T/lnk2/.."; do
    expect_fail "--staged $p" "$VMSNAP" cache evict --staged "$p"
    grep -q "symbolic link" "$T/err" || fail "--staged $p: $(cat "$T/err")"
    [ "$(cat "$T/target/keep" 2>/dev/null)" = precious ] || fail "--staged $p: the symlink's target was modified"
done
"$VMSNAP" cache evict "$T/lnk/" >/dev/null || fail "preserve evict through a symlink root"
[ "$(cat "$T/target/keep")" = precious ] || fail "preserve evict through a symlink modified the target"

# A hard link made while the file is being released (after the walk's link-count check, before
# the act): a shim links the file at the first ftruncate or unlinkat the CLI makes. The content
# must survive under the new link; only the staged name goes.
cat >"$T/race.c" <<'SHIM'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static int done;
int ftruncate(int fd, off_t len)
{
    if (!done++) {
        char p[64];
        snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
        linkat(AT_FDCWD, p, AT_FDCWD, getenv("RACE_LINK"), AT_SYMLINK_FOLLOW);
    }
    return ((int (*)(int, off_t))dlsym(RTLD_NEXT, "ftruncate"))(fd, len);
}
int unlinkat(int dfd, const char *name, int flags)
{
    if (!(flags & AT_REMOVEDIR) && !done++)
        linkat(dfd, name, AT_FDCWD, getenv("RACE_LINK"), 0);
    return ((int (*)(int, const char *, int))dlsym(RTLD_NEXT, "unlinkat"))(dfd, name, flags);
}
SHIM
if "${CC:-cc}" -shared -fPIC -o "$T/race.so" "$T/race.c" -ldl 2>"$T/err"; then
    mkdir "$T/race"
    head -c 1M /dev/urandom >"$T/race/mem.img"
    sum=$(sha256sum <"$T/race/mem.img")
    RACE_LINK="$T/race-link" LD_PRELOAD="$T/race.so" \
        ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" \
        "$VMSNAP" cache evict --staged "$T/race" >"$T/ev.out" 2>"$T/err" || fail "race evict: $(cat "$T/err")"
    [ -e "$T/race-link" ] || fail "race: the shim did not run"
    [ "$(sha256sum <"$T/race-link")" = "$sum" ] || fail "race: a file linked during the eviction was truncated"
    grep -q '^removed: 0 files' "$T/ev.out" || fail "race: reported as removed: $(cat "$T/ev.out")"
    grep -q '^not removed (in use elsewhere): 1 files' "$T/ev.out" || fail "race report: $(cat "$T/ev.out")"
elif [ "${VMSNAP_REQUIRE_ALL:-0}" = 1 ]; then
    fail "race: cannot build the LD_PRELOAD shim: $(cat "$T/err")"
else
    echo "SKIP part: race test: no C compiler for the LD_PRELOAD shim" >&2
fi

# A file another process has open for writing is only evicted, and the writer's lines all land.
mkdir "$T/busy"
(
    exec 3>>"$T/busy/log"
    for i in $(seq 10); do
        echo "l$i" >&3
        sleep .1
    done
) &
writer=$!
sleep .3
"$VMSNAP" cache evict --staged "$T/busy" >"$T/ev.out" 2>"$T/err" || fail "busy evict: $(cat "$T/err")"
wait "$writer"
[ "$(wc -l <"$T/busy/log" 2>/dev/null)" = 10 ] || fail "a file open for writing elsewhere was removed or truncated"
grep -q '^removed: 0 files' "$T/ev.out" && grep -q '^not removed (in use elsewhere): 1 files' "$T/ev.out" \
    || fail "busy report: $(cat "$T/ev.out")"
grep -q "busy/log: open or mapped by another process" "$T/err" || fail "busy file not named: $(cat "$T/err")"

# A file being executed (ETXTBSY for writing) is only evicted, not an error.
mkdir "$T/exe"
cp /bin/sleep "$T/exe/sleep"
"$T/exe/sleep" 3 &
sleeper=$!
sleep .3
"$VMSNAP" cache evict --staged "$T/exe" >"$T/ev.out" 2>"$T/err" || fail "evict of a running program: $(cat "$T/err")"
kill "$sleeper" 2>/dev/null || true
wait "$sleeper" 2>/dev/null || true
cmp -s /bin/sleep "$T/exe/sleep" || fail "a running program was removed or truncated"
grep -q '^not removed (in use elsewhere): 1 files' "$T/ev.out" || fail "running program report: $(cat "$T/ev.out")"

# ---- needs root (mounts, another user) ----
mkdir "$T/probe"
if ! mount -t tmpfs vmsnap-probe "$T/probe" 2>/dev/null; then
    skip "cannot mount (needs root): bind mount and read-only tests not run"
fi
mounts+=("$T/probe")

# Leases unavailable (not the owner, no CAP_LEASE): said once, files removed as before.
chmod o+x "$T"
mkdir -m 777 "$T/nolease"
for i in 1 2; do
    head -c 4096 /dev/urandom >"$T/nolease/f$i"
    chmod 666 "$T/nolease/f$i"
done
# f1 is mapped by another process meanwhile (as a VMM maps guest RAM): without a lease that
# cannot be seen, so the name goes but the content must not be truncated under the mapping (the
# mapping process died of SIGBUS)
cp "$T/nolease/f1" "$T/f1.copy"
python3 -c '
import mmap, os, sys, time
f = open(sys.argv[1], "r+b"); m = mmap.mmap(f.fileno(), 0)
open(sys.argv[2], "w").close()
while os.path.exists(sys.argv[1]): time.sleep(0.05)
open(sys.argv[3], "wb").write(m[:])' "$T/nolease/f1" "$T/mapped.ready" "$T/mapped.out" &
mpid=$!
wait_for 5 test -e "$T/mapped.ready" || fail "the process to map a staged file did not start"
setpriv --reuid=65534 --regid=65534 --clear-groups "$VMSNAP" cache evict --staged "$T/nolease" \
    >"$T/ev.out" 2>"$T/err" || fail "evict without leases: $(cat "$T/err")"
rc=0 && wait "$mpid" || rc=$?
[ "$rc" = 0 ] || fail "the process mapping a staged file died (exit $rc) when leases were unavailable"
cmp -s "$T/mapped.out" "$T/f1.copy" || fail "the mapped staged file's content changed under its mapping"
grep -q '^removed: 2 files' "$T/ev.out" || fail "evict without leases: $(cat "$T/ev.out")"
[ "$(grep -c 'file leases unavailable' "$T/err")" = 1 ] || fail "lease fallback not said once: $(cat "$T/err")"

# A staged file the caller may not write (mode 0444, another owner's directory entry) is only
# evicted and counted as not writable (it failed the whole evict and stayed cached)
mkdir -m 777 "$T/rostage"
head -c 65536 /dev/urandom >"$T/rostage/f"
chown 65534:65534 "$T/rostage/f" && chmod 444 "$T/rostage/f"
sync "$T/rostage/f" && cat "$T/rostage/f" >/dev/null # clean pages: only those are dropped
setpriv --reuid=65534 --regid=65534 --clear-groups "$VMSNAP" cache evict --staged "$T/rostage" \
    >"$T/ev.out" 2>"$T/err" || fail "evict --staged of a read-only file: $(cat "$T/err")"
grep -q '^not removed (not writable): 1 files' "$T/ev.out" || fail "read-only staged file: $(cat "$T/ev.out")"
[ -f "$T/rostage/f" ] || fail "the read-only staged file was removed"
[ "$(cached_pages "$T/rostage/f")" = 0 ] ||
    fail "the read-only staged file is still cached"

# A bind mount below the --staged root (same file system, same st_dev) is not entered.
mkdir -p "$T/outside" "$T/bm/sub"
echo precious >"$T/outside/keep"
echo mine >"$T/bm/own"
mount --bind "$T/outside" "$T/bm/sub"
mounts+=("$T/bm/sub")
"$VMSNAP" cache evict --staged "$T/bm" >"$T/ev.out" 2>"$T/err" || fail "bind mount evict: $(cat "$T/err")"
[ "$(cat "$T/outside/keep" 2>/dev/null)" = precious ] || fail "staged evict deleted a file through a bind mount"
[ ! -e "$T/bm/own" ] || fail "bind mount evict: the tree's own file was not removed"
grep -q '^skipped (other mounts): 1 directories' "$T/ev.out" || fail "bind mount report: $(cat "$T/ev.out")"
grep -q "bm/sub: on another mount" "$T/err" || fail "bind mount not named: $(cat "$T/err")"

# A read-only mount: nothing removed, clean pages still dropped, exit 0.
mkdir -p "$T/rosrc" "$T/ro"
head -c 1M /dev/urandom >"$T/rosrc/x.img"
sync "$T/rosrc/x.img"
cat "$T/rosrc/x.img" >/dev/null
sum=$(sha256sum <"$T/rosrc/x.img")
mount --bind "$T/rosrc" "$T/ro"
mounts+=("$T/ro")
mount -o remount,bind,ro "$T/ro"
"$VMSNAP" cache evict --staged "$T/ro" >"$T/ev.out" 2>"$T/err" || fail "read-only evict: $(cat "$T/err")"
[ "$(sha256sum <"$T/rosrc/x.img")" = "$sum" ] || fail "read-only evict changed the file"
grep -q '^not removed (not writable): 1 files' "$T/ev.out" || fail "read-only report: $(cat "$T/ev.out")"
grep -q '^dropped: 256 pages' "$T/ev.out" || fail "read-only evict did not drop the clean pages: $(cat "$T/ev.out")"

# A user other than root: cachestat is refused (EPERM, Linux 6.10+) on a file it neither owns
# nor may write; that file is skipped, and the next one, its own, is still evicted (one EPERM
# turned cachestat off for the whole process: nothing was evicted)
if id nobody >/dev/null 2>&1 && command -v setpriv >/dev/null; then
    mkdir -p "$T/un" && chmod 711 "$T" && chmod 755 "$T/un"
    head -c 1M /dev/urandom >"$T/un/root.img" && head -c 1M /dev/urandom >"$T/un/own.img"
    chown nobody "$T/un/own.img" && sync "$T/un/root.img" "$T/un/own.img"
    cat "$T/un/root.img" "$T/un/own.img" >/dev/null
    setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups \
        "$VMSNAP" cache evict "$T/un/root.img" "$T/un/own.img" >"$T/ev.out" 2>"$T/err" ||
        fail "evict as another user: $(cat "$T/err")"
    grep -q '^dropped: \(256\|512\) pages' "$T/ev.out" || fail "evict as another user did not drop its own file: $(cat "$T/ev.out") $(cat "$T/err")"
    [ "$(cached_pages "$T/un/own.img")" -le 2 ] ||
        fail "its own file is still cached after evict as another user"
    chmod 700 "$T"
else
    echo "note: no user nobody or no setpriv: eviction as another user is not exercised"
fi
done_tests
