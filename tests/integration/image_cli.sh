#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The codec through the CLI as a user drives it: exit codes, usage errors, modes, stdout/stdin,
# an existing destination untouched by a failed unpack, inspect's output and --json.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/lib.sh"

truncate -s 20M "$T/src"
dd if=/dev/urandom of="$T/src" bs=1M count=2 seek=3 conv=notrunc status=none
head -c 3000000 /usr/bin/bash | dd of="$T/src" bs=1M seek=12 conv=notrunc status=none

"$VMSNAP" -q pack -j 2 "$T/src" "$T/img" || fail "pack"
[ "$(stat -c %a "$T/img")" = 600 ] || fail "image mode is $(stat -c %a "$T/img"), want 600"
"$VMSNAP" -q unpack "$T/img" "$T/out" || fail "unpack"
cmp -s "$T/src" "$T/out" || fail "round trip differs"

# stdout and stdin
"$VMSNAP" -q pack "$T/src" - > "$T/img2" || fail "pack to stdout"
cmp -s "$T/img" "$T/img2" || fail "stdout image differs from the file image"
"$VMSNAP" -q unpack - "$T/out2" < "$T/img" || fail "unpack from stdin"
cmp -s "$T/src" "$T/out2" || fail "stdin round trip differs"

# the source as its own destination is refused, and left as it was (pack X X replaced it),
# also with --force (without it, any existing file is)
cp "$T/src" "$T/self" && cp "$T/img" "$T/selfimg"
expect_fail "pack to itself" "$VMSNAP" pack -f "$T/self" "$T/self"
grep -q "$T/self: the destination is the source" "$T/err" || fail "pack to itself: $(cat "$T/err")"
expect_fail "unpack to itself" "$VMSNAP" unpack -f "$T/selfimg" "$T/selfimg"
expect_fail "unpack from stdin to itself" sh -c "'$VMSNAP' unpack -f - '$T/selfimg' < '$T/selfimg'"
grep -q "$T/selfimg: the destination is the source" "$T/err" || fail "unpack to itself: $(cat "$T/err")"
expect_fail "pack to stdout appended to the source" sh -c "'$VMSNAP' pack '$T/self' - >>'$T/self'"
cmp -s "$T/src" "$T/self" && cmp -s "$T/img" "$T/selfimg" || fail "a refused pack or unpack changed its source"
# only a regular file is ever replaced: a rename over a device, a FIFO or a link put a file in
# its place (`pack IMG /dev/null` as root replaced /dev/null), and a directory failed only
# after all the work; a FIFO as pack's source no longer blocks the open (a signal could not
# stop it)
mknod "$T/dev" c 1 3 && mkfifo "$T/fifo" && ln -s "$T/keep-target" "$T/lnk" && echo t >"$T/keep-target" &&
    mkdir "$T/adir" || fail "test setup: special files"
for d in dev fifo lnk adir; do
    expect_fail "pack to a $d" timeout 30 "$VMSNAP" pack -f "$T/src" "$T/$d"
    grep -q "$T/$d is a .*, not a file: not replaced" "$T/err" || fail "pack to a $d: $(cat "$T/err")"
    expect_fail "unpack to a $d" timeout 30 "$VMSNAP" unpack --force "$T/img" "$T/$d"
    grep -q "$T/$d is a .*, not a file: not replaced" "$T/err" || fail "unpack to a $d: $(cat "$T/err")"
done
[ -c "$T/dev" ] && [ -p "$T/fifo" ] && [ -L "$T/lnk" ] && [ "$(cat "$T/keep-target")" = t ] && [ -d "$T/adir" ] ||
    fail "a refused destination was replaced: $(ls -l "$T")"
expect_fail "pack of a FIFO" timeout 30 "$VMSNAP" pack "$T/fifo" "$T/fromfifo"
grep -q "fifo: not a regular file" "$T/err" || fail "pack of a FIFO: $(cat "$T/err")"
rm -f "$T/dev" "$T/fifo" "$T/lnk" "$T/keep-target" && rmdir "$T/adir"
# a file that reports size 0 but has data (/proc) was packed as an empty image, exit 0
expect_fail "pack of a /proc file" "$VMSNAP" pack /proc/self/status "$T/proc.vs"
grep -q "reports a size of 0 but has data" "$T/err" || fail "pack of a /proc file: $(cat "$T/err")"
# plain zstd over --max-size is refused as over the cap (a policy), not as corrupt
zstd -q -c "$T/src" >"$T/plain.zst"
expect_fail "plain zstd over --max-size" "$VMSNAP" unpack --max-size 1M "$T/plain.zst" "$T/pz"
grep -q "passes the cap of 1048576 bytes (--max-size" "$T/err" && ! grep -q corrupt "$T/err" ||
    fail "plain zstd over --max-size: $(cat "$T/err")"
# inspect of plain zstd: populated is what unpack writes (64 KiB blocks not all zero), frames
# counted, what only a seek table records is null (it read 0 populated, 0 frames, ratio 0)
want=$(python3 -c '
import sys
d = open(sys.argv[1], "rb").read()
print(sum(len(d[i:i + 65536]) for i in range(0, len(d), 65536) if d[i:i + 65536].strip(b"\0")))' "$T/src")
"$VMSNAP" inspect --json "$T/plain.zst" >"$T/jp" || fail "inspect plain zstd"
grep -q "\"populated_bytes\":$want,\"zero_elided_bytes\":null,\"frames\":1,\"frame_bytes\":null," "$T/jp" ||
    fail "inspect of plain zstd (want populated $want): $(cat "$T/jp")"
# ... skippable frames around it are not counted as frames
{ printf '\x50\x2a\x4d\x18\x04\x00\x00\x00abcd'; cat "$T/plain.zst"; printf '\x51\x2a\x4d\x18\x00\x00\x00\x00'; } >"$T/skp.zst"
"$VMSNAP" inspect --json "$T/skp.zst" >"$T/jp" && grep -q '"frames":1,' "$T/jp" ||
    fail "inspect of plain zstd between skippable frames: $(cat "$T/jp")"
# inspect has the --max-size its cap message names
expect_fail "inspect over --max-size" "$VMSNAP" inspect --max-size 1M "$T/plain.zst"
"$VMSNAP" inspect --max-size 1G "$T/plain.zst" >/dev/null || fail "inspect --max-size 1G"

# options change the output the way they say
"$VMSNAP" -q pack --level 9 --frame-size 4M "$T/src" "$T/img9" || fail "pack --level 9"
"$VMSNAP" inspect --json "$T/img9" > "$T/j9" || fail "inspect --json"
grep -q '"frames":3,"frame_bytes":4194304,' "$T/j9" ||
    fail "4M frames: data lies in ranges 0, 1 and 3: $(cat "$T/j9")"
"$VMSNAP" inspect --json "$T/img" > "$T/j1"
grep -q '"frames":1,"frame_bytes":67108864,' "$T/j1" ||
    fail "64M frames: all data in range 0: $(cat "$T/j1")"
grep -q '"logical_bytes":20971520' "$T/j1" || fail "logical size in --json"
# a stream on stdin (a pipe: read in order) reports what the file does (its seek table comes
# last and gives zero_elided and frame_size)
cat "$T/img9" | "$VMSNAP" inspect --json - | sed 's/"path":"-"/"path":"X"/' >"$T/j9p"
sed 's/"path":"[^"]*"/"path":"X"/' "$T/j9" | cmp -s - "$T/j9p" || fail "inspect of a pipe: $(cat "$T/j9p") vs $(cat "$T/j9")"
"$VMSNAP" inspect --verify "$T/img" > "$T/iv" || fail "inspect --verify"
grep -q "all checksums match" "$T/iv" || fail "inspect --verify output"

# a failed unpack never touches an existing destination (one --force lets it replace)
echo "precious" > "$T/keep"
head -c 1000 "$T/img" > "$T/cut"
expect_fail "unpack of a truncated image" "$VMSNAP" unpack -f "$T/cut" "$T/keep"
[ "$(cat "$T/keep")" = precious ] || fail "existing destination was modified by a failed unpack"
grep -q "truncated" "$T/err" || fail "truncation message: $(cat "$T/err")"
ls -a "$T" | grep -q '^\.keep\.' && fail "temporary file left behind"

# errors name the file
expect_fail "missing source" "$VMSNAP" pack "$T/nope" "$T/x"
grep -q "$T/nope" "$T/err" || fail "error does not name the missing file"
[ -e "$T/x" ] && fail "failed pack left a destination"
expect_fail "unpack into a missing directory" "$VMSNAP" unpack "$T/img" "$T/no/such/dir/out"

# usage errors exit 2
rc=0; "$VMSNAP" pack -T 257 "$T/src" "$T/x" 2>/dev/null || rc=$?
[ "$rc" = 2 ] || fail "-T 257: exit $rc, want 2"
# a size is decimal with an optional K/M/G/T[iB] (strtod also took nan, inf and 0x1p20)
for v in nan inf 0x1p20 -1M 1Q; do
    rc=0; "$VMSNAP" pack --frame-size "$v" "$T/src" "$T/x" 2>"$T/err" || rc=$?
    [ "$rc" = 2 ] || fail "--frame-size $v: exit $rc, want 2"
done
# a frame size the encoder does not take is a usage error too, as --level 0 and -T 257 are
# (it exited 1), and 0 is not taken as the default (it was)
for v in 1000 0 4095 2G; do
    rc=0; "$VMSNAP" pack --frame-size "$v" "$T/src" "$T/x" 2>"$T/err" || rc=$?
    [ "$rc" = 2 ] || fail "--frame-size $v: exit $rc, want 2"
    rc=0; "$VMSNAP" push --frame-size "$v" "$T/src" "$T/xs" 2>"$T/err" || rc=$?
    [ "$rc" = 2 ] || fail "push --frame-size $v: exit $rc, want 2"
done
[ -e "$T/x" ] || [ -e "$T/xs" ] && fail "a refused --frame-size wrote something"
rc=0; "$VMSNAP" unpack "$T/img" 2>/dev/null || rc=$?
[ "$rc" = 2 ] || fail "missing DST: exit $rc, want 2"
rc=0; "$VMSNAP" frobnicate 2>/dev/null || rc=$?
[ "$rc" = 2 ] || fail "unknown verb: exit $rc, want 2"
"$VMSNAP" --version | grep -q '^vmsnap [0-9]' || fail "--version"
"$VMSNAP" help pack | grep -q -- '--frame-size' || fail "help pack"
# --help anywhere a user would try it prints usage and exits 0
for c in "disk --help" "disk create --help" "disk clone --help" "disk info --help" "vm --help" \
    "vm run --help" "cache --help" "cache stat --help" "push --help" "pull --help" "gc --help" \
    "help disk" "help push"; do
    rc=0; $VMSNAP $c >"$T/out" 2>"$T/err" || rc=$?
    [ "$rc" = 0 ] && grep -q usage "$T/out" || fail "$c: exit $rc: $(cat "$T/out" "$T/err")"
done
"$VMSNAP" help disk | grep -q -- '--direct' || fail "help disk lacks --direct"
# -q and -v work after the verb too (they were usage errors there)
"$VMSNAP" pack -q "$T/src" "$T/imgq" 2>"$T/err" && [ ! -s "$T/err" ] || fail "pack -q: $(cat "$T/err")"
"$VMSNAP" unpack "$T/imgq" "$T/outq" --quiet 2>"$T/err" && [ ! -s "$T/err" ] || fail "unpack ... --quiet: $(cat "$T/err")"
cmp -s "$T/src" "$T/outq" || fail "pack -q round trip"
# ... and an option's value that reads -v stays the value (a pre-scan took it for the flag)
"$VMSNAP" disk create --size 16M --label -v "$T/lv.img" && "$VMSNAP" disk info "$T/lv.img" | grep -q "^label: *-v$" ||
    fail "disk create --label -v"
rc=0; "$VMSNAP" vm bogus 2>"$T/err" || rc=$?
[ "$rc" = 2 ] && grep -q "unknown subcommand 'bogus'" "$T/err" || fail "vm bogus: exit $rc: $(cat "$T/err")"

# --drop-cache: the restored file (on a disk filesystem, where the page cache is droppable) ends
# with under 1% of its pages cached, for unpack and for pull from the local store
cached_pct() { "$VMSNAP" cache stat --json "$1" | jget - 'int(100 * j["total"]["cached"] / max(1, j["total"]["pages"]))'; }
if [ "$(stat -f -c %T "$T")" = tmpfs ]; then
    skip "drop-cache checks need a disk filesystem for TMPDIR, not tmpfs"
fi
"$VMSNAP" -q unpack "$T/img" "$T/warm" && cat "$T/warm" > /dev/null
[ "$(cached_pct "$T/warm")" -ge 50 ] || fail "baseline: a file just read should be cached"
"$VMSNAP" unpack --drop-cache "$T/img" "$T/dropped" 2>"$T/dc.err" || fail "unpack --drop-cache"
grep -q "page cache: dropped" "$T/dc.err" || fail "unpack --drop-cache does not report: $(cat "$T/dc.err")"
p=$(cached_pct "$T/dropped"); [ "$p" -lt 1 ] || fail "after unpack --drop-cache $p% is cached"
cmp -s "$T/src" "$T/dropped" || fail "unpack --drop-cache output differs"
"$VMSNAP" -q push "$T/src" "$T/store/obj" || fail "push to the local store"
"$VMSNAP" -q pull --drop-cache "$T/store/obj" "$T/pulled" || fail "pull --drop-cache"
p=$(cached_pct "$T/pulled"); [ "$p" -lt 1 ] || fail "after pull --drop-cache $p% is cached"
cmp -s "$T/src" "$T/pulled" || fail "pull --drop-cache output differs"

# quiet means quiet; not a TTY means no progress line
out=$("$VMSNAP" -q pack "$T/src" "$T/img3" 2>&1)
[ -z "$out" ] || fail "-q printed: $out"
# --fsync: the same object, durable before it appears
"$VMSNAP" -q pack --fsync "$T/src" "$T/img3s" || fail "pack --fsync"
cmp -s "$T/img3" "$T/img3s" || fail "pack --fsync wrote other bytes"

# interrupted (SIGTERM) while waiting on a pipe that has sent half an object: exit 143 saying so,
# nothing at the destination, no temporary file
"$VMSNAP" -q pack "$T/src" "$T/img4"
{ head -c $(($(stat -c %s "$T/img4") / 2)) "$T/img4"; sleep 5; } |
    "$VMSNAP" unpack - "$T/uint" 2>"$T/err" &
pid=$!
sleep 1
kill -TERM "$pid"
rc=0 && wait "$pid" || rc=$?
[ "$rc" = 143 ] || fail "interrupted unpack: exit $rc ($(cat "$T/err"))"
grep -q "interrupted (SIGTERM)" "$T/err" || fail "interrupted unpack: message: $(cat "$T/err")"
[ -e "$T/uint" ] && fail "the interrupted unpack left its destination"
ls -A "$T" | grep -q '^\.uint' && fail "the interrupted unpack left a temporary file"
# ... a pack writing to a pipe nobody reads (a stalled consumer): the signal still stops it
mkfifo "$T/fifo"
exec 3<>"$T/fifo" # holds the pipe open, never reads
"$VMSNAP" pack "$T/src" - >"$T/fifo" 2>"$T/err" &
pid=$!
sleep 1
kill -TERM "$pid"
rc=0 && wait "$pid" || rc=$?
exec 3<&-
[ "$rc" = 143 ] || fail "pack to a stalled pipe, interrupted: exit $rc ($(cat "$T/err"))"
grep -q "interrupted (SIGTERM)" "$T/err" || fail "pack to a stalled pipe: message: $(cat "$T/err")"
# ... and a pack inside one long frame (--level 19: 32 MiB of base64 text takes tens of
# seconds): the signal stops the compression, it does not wait for the frame (it did, then
# exited 0)
head -c 24M /dev/urandom | base64 -w 0 >"$T/slow"
"$VMSNAP" pack --level 19 "$T/slow" "$T/slow.img" 2>"$T/err" &
pid=$!
sleep 2
kill -TERM "$pid"
rc=0 && wait "$pid" || rc=$?
[ "$rc" = 143 ] && grep -q "interrupted (SIGTERM)" "$T/err" && [ ! -e "$T/slow.img" ] ||
    fail "pack --level 19, interrupted inside a frame: exit $rc ($(cat "$T/err"))"
rm -f "$T/slow"
# ... and a signal inherited as ignored (nohup, a script's background job) stays ignored
half=$(($(stat -c %s "$T/img4") / 2))
{ head -c "$half" "$T/img4"; sleep 2; tail -c +"$((half + 1))" "$T/img4"; } |
    sh -c 'trap "" HUP; exec "$0" -q unpack - "$1"' "$VMSNAP" "$T/uhup" 2>"$T/err" &
pid=$!
sleep 1
kill -HUP "$pid"
rc=0 && wait "$pid" || rc=$?
[ "$rc" = 0 ] || fail "unpack with SIGHUP ignored: exit $rc ($(cat "$T/err"))"
cmp -s "$T/src" "$T/uhup" || fail "unpack with SIGHUP ignored: output differs"
# a pipe given as a path (process substitution) is read as a stream ("Illegal seek" before)
"$VMSNAP" -q unpack <(cat "$T/img4") "$T/ufifo" || fail "unpack from a FIFO path"
cmp -s "$T/src" "$T/ufifo" || fail "unpack from a FIFO path: output differs"
# A source written while it is packed (a shim appends to it at the first read of its data)
# fails the pack, naming it, with nothing at the destination; the same for a push (an object
# mixing two moments of the file was stored and pulled back without a word)
if "${CC:-cc}" -shared -fPIC -o "$T/grow.so" "$SRC/tests/shims/pread_change.c" -ldl 2>"$T/err"; then
    for verb in pack push; do
        head -c 3000000 /dev/urandom >"$T/chg"
        SHIM_FILE="$T/chg" LD_PRELOAD="$T/grow.so" \
            ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" \
            "$VMSNAP" $verb "$T/chg" "$T/chg.out" 2>"$T/err" && fail "$verb of a file written meanwhile succeeded"
        [ "$(stat -c %s "$T/chg")" = 3000008 ] || fail "$verb: the shim did not run"
        grep -q "chg changed while being read" "$T/err" || fail "$verb of a changed file: $(cat "$T/err")"
        [ ! -e "$T/chg.out" ] || fail "$verb of a changed file left its destination"
    done
elif [ "${VMSNAP_REQUIRE_ALL:-0}" = 1 ]; then
    fail "cannot build the LD_PRELOAD shim: $(cat "$T/err")"
fi
done_tests
