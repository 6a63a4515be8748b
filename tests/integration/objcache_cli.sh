#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# vmsnap cache objects / cache trim over a real cache directory (entries laid out as
# docs/objcache.md says: files objects/<key>, their mtime the last use): the text and the JSON
# (parsed) list every entry with its size and last use, the totals and the cap; a file that is
# not a key is not listed; --cache-dir / --cache-size and VMSNAP_CACHE_DIR / VMSNAP_CACHE_SIZE
# (the option wins); trim evicts the least recently used first, to --max-size or to the cap,
# and counts; a dead fill's temporary is swept; a symlinked, group-writable or (as root)
# foreign-owned directory is refused (exit 1); bad sizes are usage errors (exit 2).
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/lib.sh"

C="$T/cache"
"$VMSNAP" cache objects --cache-dir "$C" >"$T/o.txt" || fail "objects on a new directory"
[ "$(stat -c %a "$C")" = 700 ] || fail "cache dir mode $(stat -c %a "$C")"
for d in objects tmp locks; do [ -d "$C/$d" ] || fail "no $d/"; done
grep -q '^total: 0 entries, 0 B of 8.00 GiB' "$T/o.txt" || fail "empty: $(cat "$T/o.txt")"

# entries of 1, 2, 3 and 4 KiB, last used in the order b, d, a, c (oldest first)
put() { # put KEY KIB MTIME
    head -c $(($2 * 1024)) /dev/urandom >"$C/objects/$1"
    chmod 0400 "$C/objects/$1"
    touch -m -d "@$3" "$C/objects/$1"
}
now=$(date +%s)
put t-a 1 $((now - 300))
put t-b 2 $((now - 500))
put t-c 3 $((now - 200))
put t-d 4 $((now - 400))
echo notes >"$C/objects/README"
"$VMSNAP" cache objects --cache-dir "$C" --cache-size 1M >"$T/o.txt" || fail "objects"
grep -q '^ *SIZE  LAST USED (UTC) *KEY$' "$T/o.txt" || fail "header: $(head -1 "$T/o.txt")"
for k in a b c d; do
    grep -q " t-$k\$" "$T/o.txt" || fail "t-$k not listed: $(cat "$T/o.txt")"
done
t_b=$(date -u -d "@$((now - 500))" +%Y-%m-%dT%H:%M:%SZ)
grep -qE "^ +2.00 KiB  $t_b  t-b\$" "$T/o.txt" || fail "t-b's line: $(grep t-b "$T/o.txt")"
! grep -q README "$T/o.txt" || fail "a file that is not a key was listed"
grep -q "^total: 4 entries, 10.00 KiB of 1.00 MiB (1.0%) in $C\$" "$T/o.txt" ||
    fail "total: $(tail -1 "$T/o.txt")"

"$VMSNAP" cache objects --json --cache-dir "$C" --cache-size 1M >"$T/o.json" || fail "objects --json"
python3 - "$T/o.json" "$C" "$now" <<'EOF' || fail "objects --json: $(cat "$T/o.json")"
import json, sys
j = json.load(open(sys.argv[1]))
now = int(sys.argv[3])
want = {"t-a": (1024, now - 300), "t-b": (2048, now - 500), "t-c": (3072, now - 200),
        "t-d": (4096, now - 400)}
got = {e["key"]: (e["bytes"], e["last_used"]) for e in j["entries"]}
assert got == want, got
for e in j["entries"]:
    import time
    assert e["last_used_utc"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(e["last_used"]))
assert j["total"] == {"entries": 4, "bytes": 10240}, j["total"]
assert j["cap_bytes"] == 1048576 and j["path"] == sys.argv[2], j
EOF

# the environment, and the option over it
VMSNAP_CACHE_DIR="$C" VMSNAP_CACHE_SIZE=2M "$VMSNAP" cache objects --json >"$T/e.json" ||
    fail "objects from the environment"
[ "$(jget "$T/e.json" '(j["cap_bytes"], j["total"]["entries"], j["path"])')" = "(2097152, 4, '$C')" ] ||
    fail "environment: $(cat "$T/e.json")"
VMSNAP_CACHE_DIR="$T/elsewhere" VMSNAP_CACHE_SIZE=2M "$VMSNAP" cache objects --json \
    --cache-dir "$C" --cache-size 3M >"$T/e.json" || fail "objects with options and env"
[ "$(jget "$T/e.json" '(j["cap_bytes"], j["path"])')" = "(3145728, '$C')" ] ||
    fail "options over the environment: $(cat "$T/e.json")"
[ ! -e "$T/elsewhere" ] || fail "VMSNAP_CACHE_DIR used despite --cache-dir"
VMSNAP_CACHE_SIZE=lots expect_fail "bad VMSNAP_CACHE_SIZE" "$VMSNAP" cache objects --cache-dir "$C"
grep -q VMSNAP_CACHE_SIZE "$T/err" || fail "bad VMSNAP_CACHE_SIZE not named: $(cat "$T/err")"

# trim: least recently used first (b, then d), counted
"$VMSNAP" cache trim --cache-dir "$C" --max-size 5K >"$T/t.txt" || fail "trim"
grep -q '^evicted: 2 entries (6.00 KiB)$' "$T/t.txt" || fail "trim: $(cat "$T/t.txt")"
grep -q '^left: 2 entries, 4.00 KiB (at most 5.00 KiB)$' "$T/t.txt" || fail "trim: $(cat "$T/t.txt")"
[ -e "$C/objects/t-a" ] && [ -e "$C/objects/t-c" ] && [ ! -e "$C/objects/t-b" ] &&
    [ ! -e "$C/objects/t-d" ] || fail "trim did not evict b and d: $(ls "$C/objects")"
[ -e "$C/objects/README" ] || fail "trim removed a file that is not an entry"
# without --max-size: to the cap (--cache-size, else VMSNAP_CACHE_SIZE)
"$VMSNAP" cache trim --json --cache-dir "$C" >"$T/t.json" || fail "trim --json"
[ "$(jget "$T/t.json" '(j["evicted"], j["freed_bytes"], j["entries"], j["bytes"], j["max_bytes"])')" = \
    "(0, 0, 2, 4096, 8589934592)" ] || fail "trim to the default cap: $(cat "$T/t.json")"
VMSNAP_CACHE_SIZE=3K "$VMSNAP" cache trim --json --cache-dir "$C" >"$T/t.json" || fail "trim env"
[ "$(jget "$T/t.json" '(j["evicted"], j["freed_bytes"], j["entries"], j["max_bytes"], j["cap_bytes"])')" = \
    "(1, 1024, 1, 3072, 3072)" ] || fail "trim to VMSNAP_CACHE_SIZE: $(cat "$T/t.json")"
[ -e "$C/objects/t-c" ] && [ ! -e "$C/objects/t-a" ] || fail "trim to the cap evicted not a"
"$VMSNAP" cache trim --json --cache-dir "$C" --cache-size 1K --max-size 0 >"$T/t.json" ||
    fail "trim to 0"
[ "$(jget "$T/t.json" '(j["evicted"], j["entries"], j["bytes"], j["cap_bytes"])')" = "(1, 0, 0, 1024)" ] ||
    fail "trim to 0: $(cat "$T/t.json")"
"$VMSNAP" -q cache trim --cache-dir "$C" --max-size 0 >"$T/t.txt" && [ ! -s "$T/t.txt" ] ||
    fail "-q trim printed: $(cat "$T/t.txt")"

# a dead fill's temporary (no lock held) is swept by the next use of the cache
head -c 4096 /dev/zero >"$C/tmp/t-x.0123456789abcdef"
"$VMSNAP" cache objects --cache-dir "$C" >/dev/null || fail "objects after a dead fill"
[ -z "$(ls -A "$C/tmp")" ] || fail "temporary not swept: $(ls -A "$C/tmp")"
# a live one's is kept: its key lock held (flock, as a filler holds it)
head -c 4096 /dev/zero >"$C/tmp/t-y.0123456789abcdef"
: >"$C/locks/t-y"
flock "$C/locks/t-y" "$VMSNAP" cache objects --cache-dir "$C" >/dev/null || fail "objects, held"
[ -e "$C/tmp/t-y.0123456789abcdef" ] || fail "a live fill's temporary was swept"
"$VMSNAP" cache objects --cache-dir "$C" >/dev/null
[ -z "$(ls -A "$C/tmp")" ] && [ -z "$(ls -A "$C/locks")" ] || fail "not swept once free"

# refused directories
ln -s "$C" "$T/link"
expect_fail "symlinked dir" "$VMSNAP" cache objects --cache-dir "$T/link"
grep -q 'symbolic link' "$T/err" || fail "symlink refusal: $(cat "$T/err")"
expect_fail "symlinked dir/" "$VMSNAP" cache trim --cache-dir "$T/link/"
mkdir -m 0775 "$T/gw" && chmod 0775 "$T/gw"
expect_fail "group-writable dir" "$VMSNAP" cache objects --cache-dir "$T/gw"
grep -q 'writable by group or others' "$T/err" || fail "group-writable: $(cat "$T/err")"
if [ "$(id -u)" = 0 ]; then
    mkdir -m 0700 "$T/foreign" && chown 65534:65534 "$T/foreign"
    expect_fail "foreign-owned dir" "$VMSNAP" cache objects --cache-dir "$T/foreign"
    grep -q 'owned by uid 65534' "$T/err" || fail "foreign: $(cat "$T/err")"
    [ -z "$(ls -A "$T/foreign")" ] || fail "something created in a foreign dir"
else
    echo "note: not root, the foreign-owned case is in objcache_unit" >&2
fi

# usage
for args in "trim --max-size lots" "objects --cache-size 0" "objects --max-size 1G" \
    "objects extra" "trim --bogus"; do
    rc=0
    # shellcheck disable=SC2086
    "$VMSNAP" cache $args --cache-dir "$C" >/dev/null 2>"$T/err" || rc=$?
    [ "$rc" = 2 ] || fail "cache $args: exit $rc, expected 2"
done
"$VMSNAP" help cache | grep -q 'cache trim \[--max-size SIZE\]' || fail "help cache: no trim"
"$VMSNAP" cache trim --help | grep -q '^usage: vmsnap cache trim' || fail "trim --help"

done_tests
