#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# vmsnap cache stat/evict end to end: JSON stat accuracy, preserve mode leaves dirty pages and
# content, --staged removes single-link files only, keeps hard-linked and --preserve'd trees
# byte-identical (hashed), --wait with --kick-writeback drains dirty pages, and errors exit 1/2.
. "$VMSNAP_SRC/tests/lib.sh"

[ "$(stat -f -c %T "$T")" != tmpfs ] || skip "$T is tmpfs (no dirty page tracking); set TMPDIR"

# jget FILE EXPR: evaluate a Python expression over the parsed JSON `j`.
jget() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1"; }

head -c 8M /dev/urandom >"$T/a.img"
sync "$T/a.img"
"$VMSNAP" cache evict "$T/a.img" >/dev/null
cat "$T/a.img" >/dev/null
"$VMSNAP" cache stat --json "$T/a.img" >"$T/s.json"
[ "$(jget "$T/s.json" 'j["total"]["cached"]')" = 2048 ] || fail "read fully: not all 2048 pages cached: $(cat "$T/s.json")"
[ "$(jget "$T/s.json" 'j["files"][0]["source"]')" = cachestat ] || fail "stat source not cachestat"
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
[ "$("$VMSNAP" cache stat --json "$T/d.img" | python3 -c 'import json,sys; print(json.load(sys.stdin)["total"]["cached"])')" -le 2 ] \
    || fail "after sync, evict left pages"

# --wait + --kick-writeback: a dirty file ends clean and dropped in the foreground.
head -c 16M /dev/urandom >"$T/w.img"
"$VMSNAP" cache evict --kick-writeback --wait 10 "$T/w.img" >"$T/ev.out"
grep -q '^still dirty: 0 files' "$T/ev.out" || fail "--wait: $(cat "$T/ev.out")"
[ "$("$VMSNAP" cache stat --json "$T/w.img" | python3 -c 'import json,sys; print(json.load(sys.stdin)["total"]["cached"])')" -le 2 ] \
    || fail "--wait --kick-writeback left pages cached"

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

# Errors: a missing path exits 1 naming it; bad usage exits 2.
expect_fail "missing path" "$VMSNAP" cache stat "$T/nope"
grep -q "$T/nope" "$T/err" || fail "error does not name the path: $(cat "$T/err")"
expect_fail "missing preserve path" "$VMSNAP" cache evict --staged --preserve "$T/nope" "$T/r"
[ -e "$T/r/linked.img" ] || fail "a failed evict touched files"
rc=0; "$VMSNAP" cache evict --wait abc "$T/r" 2>/dev/null || rc=$?
[ "$rc" = 2 ] || fail "--wait abc: exit $rc, expected 2"
rc=0; "$VMSNAP" cache frob 2>/dev/null || rc=$?
[ "$rc" = 2 ] || fail "unknown subcommand: exit $rc, expected 2"
rc=0; "$VMSNAP" cache stat 2>/dev/null || rc=$?
[ "$rc" = 2 ] || fail "stat without PATH: exit $rc, expected 2"
done_tests
