#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The CLI's contract for scripts (docs/cli.md): every exit class provoked for real (usage, not
# found, access denied against RGW with wrong keys and on a directory this user cannot read,
# unreachable on a port nobody listens on and on 5xx after the retries, corrupt on a flipped
# byte and a hostile manifest, local I/O on a full 1 MiB tmpfs and a read-only one, interrupted
# by SIGINT and SIGTERM), each with --json: exactly one JSON object on stdout, its error object
# with the code, class, message and subjects, the message also on stderr. Every reporting
# verb's --json output with its documented keys; -f/--force refusal and success; -T0; -q, -v and
# -vv before and after the verb and sub-verb; did-you-mean; the TTY progress line (populated
# bytes, percentage, ETA) under a pseudo-terminal. The RGW part needs the xfer_rgw fixture.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/lib.sh"
cd "$T"
S=$T/store
mkdir -p "$S"

# jrun NAME RC [--] CMD...: run CMD with stdout in NAME.out, stderr in NAME.err; it must exit RC
# and print exactly one JSON object (schema 1) on stdout; a failure's object has "error" with
# code RC, the class of RC, a message that stderr shows too, and an errno key
jrun() {
    local name=$1 want=$2 rc=0
    shift 2
    [ "$1" = -- ] && shift
    "$@" >"$name.out" 2>"$name.err" </dev/null || rc=$?
    [ "$rc" = "$want" ] || { fail "$name: exit $rc, want $want ($(head -c 300 "$name.err"))"; return; }
    python3 - "$name" "$want" <<'EOF' || fail "$name: stdout: $(head -c 400 "$1.out")"
import json, sys
name, want = sys.argv[1], int(sys.argv[2])
text = open(name + ".out").read()
o = json.loads(text)  # one JSON document: anything more fails here
assert isinstance(o, dict) and o["schema"] == 1, o
assert text.count("\n") == 1 and text.endswith("\n"), "not one line"
classes = {1: "other", 2: "usage", 3: "not_found", 4: "access_denied", 5: "unreachable",
           6: "corrupt", 7: "local_io", 130: "interrupted", 143: "interrupted"}
if want == 0:
    assert "error" not in o, o
else:
    e = o["error"]
    assert e["code"] == want and e["class"] == classes[want], e
    assert e["message"] and "errno" in e, e
    err = open(name + ".err").read()
    assert e["message"][:40] in err, (e["message"], err)
EOF
}
# keys NAME PYTHON-EXPR...: each expression over `j` (NAME's parsed stdout) is true
keys() {
    local name=$1
    shift
    python3 - "$name.out" "$@" <<'EOF' || fail "$name: $(head -c 600 "$name.out")"
import json, sys
j = json.load(open(sys.argv[1]))
for e in sys.argv[2:]:
    assert eval(e), e
EOF
}
# seconds3 NAME: every timing key ("seconds", "*_seconds" in it but ages) holds 3 decimals
seconds3() {
    python3 - "$1.out" <<'EOF' || fail "$1: timings not with 3 decimals: $(cat "$1.out")"
import re, sys
t = open(sys.argv[1]).read()
found = re.findall(r'"(\w*seconds)":(-?[0-9.]+)', t)
assert found, "no timing"
for k, v in found:
    if k not in ("age_seconds", "older_than_seconds"):
        assert re.fullmatch(r"[0-9]+\.[0-9]{3}", v), (k, v)
EOF
}

mk f 3000000
head -c 1M /dev/urandom | dd of=sparse bs=1M seek=40 conv=notrunc status=none # 41 MiB, 1 populated
mkdir -p set && mk set/memory 200000 && echo '{"s":1}' >set/state.json

# ---- usage (2) ----
jrun u1 2 "$VMSNAP" push --json f
jrun u2 2 "$VMSNAP" --json psuh
grep -q "vmsnap psuh: unknown verb; did you mean 'push'?" u2.err || fail "did-you-mean verb: $(cat u2.err)"
jrun u3 2 "$VMSNAP" push --jsn --json f "$S/x"
grep -q "unknown option '--jsn'; did you mean '--json'?" u3.err || fail "did-you-mean option: $(cat u3.err)"
jrun u4 2 "$VMSNAP" vm lss --json
grep -q "unknown subcommand 'lss'; did you mean 'ls'?" u4.err || fail "did-you-mean sub-verb: $(cat u4.err)"
jrun u5 2 "$VMSNAP" disk craete --json x.img
grep -q "did you mean 'create'?" u5.err || fail "did-you-mean disk: $(cat u5.err)"
jrun u6 2 "$VMSNAP" pack --json --level 99 f x
rc=0 && "$VMSNAP" frobnicate 2>u7.err || rc=$?
[ $rc = 2 ] && ! grep -q "did you mean" u7.err || fail "an unlike verb: exit $rc, $(cat u7.err)"
rc=0 && "$VMSNAP" pack --level 2>u8.err || rc=$?
[ $rc = 2 ] && grep -q "option '--level' wants an argument" u8.err || fail "missing argument: $(cat u8.err)"
# the old refusal of gc --json is gone
jrun gcj 0 "$VMSNAP" gc --json "$S"

# ---- not found (3) ----
jrun nf1 3 "$VMSNAP" push --json nofile "$S/a"
keys nf1 'j["error"]["path"] == "nofile"' 'j["error"]["url"] == "'"$S"'/a"' 'j["error"]["errno"] == "ENOENT"'
jrun nf2 3 "$VMSNAP" pull --json "$S/none" out
jrun nf3 3 "$VMSNAP" inspect --json nofile
jrun nf4 3 "$VMSNAP" vm stop --json nope --state-dir "$T/vs"
keys nf4 'j["error"]["name"] == "nope"'
jrun nf5 3 "$VMSNAP" disk info --json nope.img
jrun nf6 3 "$VMSNAP" rm --json "$S/none"

# ---- corrupt (6) ----
"$VMSNAP" -q pack f img || fail "pack"
cp img bad && python3 -c "
import sys; d = bytearray(open('bad', 'rb').read()); d[len(d) // 2] ^= 1; open('bad', 'wb').write(d)"
jrun c1 6 "$VMSNAP" unpack --json bad bad.out
keys c1 'j["error"]["errno"] == "EBADMSG"' '"checksum" in j["error"]["message"]'
[ -e bad.out ] && fail "a corrupt unpack left its destination"
jrun c2 6 "$VMSNAP" inspect --json --verify bad
"$VMSNAP" -q push set "$S/hostile" || fail "push of the set"
printf '{"snapshotFiles":["../escape"]}' >"$S/hostile/manifest.json"
jrun c3 6 "$VMSNAP" pull --json "$S/hostile" hout
[ -e escape ] || [ -e hout ] && fail "a hostile manifest wrote something"

# ---- local I/O (7) ----
LOCAL_IO=
if mkdir -p mnt && mount -t tmpfs -o size=1M tmpfs mnt 2>/dev/null; then
    at_exit "umount '$T/mnt'"
    jrun io1 7 "$VMSNAP" pack --json f mnt/img
    keys io1 'j["error"]["errno"] == "ENOSPC"' 'j["error"]["path"] == "mnt/img"'
    "$VMSNAP" -q push f "$S/f3" || fail "push of a 3 MB file"
    jrun io2 7 "$VMSNAP" pull --json "$S/f3" mnt/p
    [ -z "$(ls -A mnt)" ] || fail "a full disk kept a partial file: $(ls -A mnt)"
    mount -o remount,ro mnt
    jrun io3 7 "$VMSNAP" unpack --json img mnt/u
    keys io3 'j["error"]["errno"] == "EROFS"'
    umount mnt
else
    LOCAL_IO="cannot mount a tmpfs here (not root?): the local I/O class was not provoked"
fi

# ---- access denied (4), local: a directory this user cannot read ----
if command -v setpriv >/dev/null && setpriv --reuid=nobody --regid=nogroup --clear-groups true 2>/dev/null; then
    mkdir -m 0700 "$S/private" && chmod o+x "$T" "$S" && cp f "$T/pub" && chmod 644 "$T/pub"
    jrun ad1 4 setpriv --reuid=nobody --regid=nogroup --clear-groups "$VMSNAP" push --json "$T/pub" "$S/private/x"
    keys ad1 'j["error"]["errno"] == "EACCES"'
fi

# ---- interrupted (130, 143): a push of a big file stopped at a known point, then signalled ----
mkdir -p big && mk big/memory $((32 << 20))
for sig in INT TERM; do
    VMSNAP_FAILPOINT=layered-uploaded:stop env --default-signal=INT "$VMSNAP" push --json big "$S/int" \
        >"int$sig.out" 2>"int$sig.err" &
    pid=$!
    wait_stopped $pid 30 || fail "the push did not stop at its mark"
    kill -"$sig" $pid && kill -CONT $pid
    rc=0 && wait $pid || rc=$?
    want=$([ $sig = INT ] && echo 130 || echo 143)
    [ $rc = "$want" ] || fail "push interrupted by SIG$sig: exit $rc, want $want ($(cat "int$sig.err"))"
    python3 - "int$sig.out" "$want" <<'EOF' || fail "SIG$sig: $(cat "int$sig.out")"
import json, sys
o = json.loads(open(sys.argv[1]).read())
e = o["error"]
assert o["schema"] == 1 and e["code"] == int(sys.argv[2]) and e["class"] == "interrupted", o
assert e["errno"] == "ECANCELED", e
EOF
done
[ -e "$S/int/manifest.json" ] && fail "an interrupted push committed"

# ---- --json of every reporting verb, with its documented keys ----
jrun push 0 "$VMSNAP" push --json set "$S/s1"
keys push 'j["path"] == "set" and j["url"] == "'"$S"'/s1"' 'j["files"] == 2' \
    'j["logical_bytes"] == 200008 and j["populated_bytes"] == 200008' \
    'j["object_bytes"] > 0 and j["copied_bytes"] == 0' 'set(j) >= {"seconds", "cpu_seconds"}'
seconds3 push
jrun pull 0 "$VMSNAP" pull --json "$S/s1" sout
keys pull 'j["url"] == "'"$S"'/s1" and j["path"] == "sout"' 'j["files"] == 2' \
    'j["logical_bytes"] == 200008 and j["object_bytes"] > 0'
seconds3 pull
jrun ls 0 "$VMSNAP" ls --json "$S"
keys ls 'j["url"] == "'"$S"'"' \
    '[s["files"] for s in j["sets"] if s["url"].endswith("/s1")] == [2]' \
    'all(set(s) >= {"url", "valid"} for s in j["sets"])' \
    'all(set(s) >= {"files", "logical_bytes", "object_bytes"} for s in j["sets"] if s["valid"])'
jrun gc 0 "$VMSNAP" gc --json --dry-run --older-than 0 "$S"
keys gc 'j["dry_run"] is True and j["older_than_seconds"] == 0' \
    'set(j) >= {"items", "aborted_uploads", "cleaned_pushes", "objects", "kept", "unknown_age"}' \
    'all(set(i) == {"kind", "url", "age_seconds", "action"} for i in j["items"])'
jrun rm 0 "$VMSNAP" rm --json "$S/s1"
keys rm 'j["url"] == "'"$S"'/s1" and j["removed"] == "set" and j["objects"] == 0' \
    'set(j) >= {"uploads", "pushes", "kept", "kept_url"}'
[ -s rm.err ] && fail "rm --json also printed text: $(cat rm.err)"
jrun pack 0 "$VMSNAP" pack --json sparse sparse.img
keys pack 'j["source_path"] == "sparse" and j["path"] == "sparse.img"' \
    'j["logical_bytes"] == 41 << 20 and j["populated_bytes"] == 1 << 20' \
    'set(j) >= {"zero_elided_bytes", "object_bytes", "frames", "ratio"}'
seconds3 pack
jrun unpack 0 "$VMSNAP" unpack --json sparse.img sparse.out
keys unpack 'j["source_path"] == "sparse.img" and j["path"] == "sparse.out"' \
    'j["logical_bytes"] == 41 << 20 and j["zero_elided_bytes"] is None'
seconds3 unpack
jrun inspect 0 "$VMSNAP" inspect --json sparse.img
keys inspect 'j["path"] == "sparse.img" and j["logical_bytes"] == 41 << 20' \
    'j["populated_bytes"] == 1 << 20 and j["frame_bytes"] == 64 << 20' \
    'set(j) >= {"format", "zero_elided_bytes", "frames", "object_bytes", "ratio", "verified"}'
jrun cstat 0 "$VMSNAP" cache stat --json f set
keys cstat 'j["page_bytes"] > 0 and j["total"]["files"] == 3' \
    'all(set(f) >= {"path", "logical_bytes", "pages", "cached", "method"} for f in j["files"])'
# a failing path: the object keeps what was listed and gains "error"
jrun cstat2 3 "$VMSNAP" cache stat --json f nofile
keys cstat2 'len(j["files"]) == 1 and j["total"]["files"] == 1'
jrun cevict 0 "$VMSNAP" cache evict --json f
keys cevict 'set(j) >= {"dropped_pages", "dropped_bytes", "dropped_files", "removed_files", "dirty_files"}'
jrun dcreate 0 "$VMSNAP" disk create --json --size 16M d.img
keys dcreate 'j["path"] == "d.img" and j["logical_bytes"] == 16 << 20' \
    'set(j) >= {"allocated_bytes", "block_bytes", "uuid", "features", "clean"}'
jrun dclone 0 "$VMSNAP" disk clone --json d.img d2.img
keys dclone 'j["source_path"] == "d.img" and j["path"] == "d2.img" and j["method"] in ("link", "ficlone", "extents", "read-write", "direct")'
jrun dinfo 0 "$VMSNAP" disk info --json d2.img
keys dinfo 'j["path"] == "d2.img" and j["logical_bytes"] == 16 << 20 and j["inodes_used"] > 0'
SD=$T/vs && mkdir -p "$SD/vms/k"
printf '{"name":"k","status":"stopped","memory":536870912,"cpus":1,"kernel":"/none/k","accel":"tcg",%s}' \
    "\"ram_path\":\"/dev/shm/vmsnap-0000-k.ram\",\"run_dir\":\"$SD/vms/k/run\"" >"$T/k.json"
cp "$T/k.json" "$SD/vms/k/vm.json"
jrun vmls 0 env VMSNAP_RAM_DIR=/dev/shm "$VMSNAP" vm ls --json --state-dir "$SD"
keys vmls '[v["name"] for v in j["vms"]] == ["k"]' \
    'set(j["vms"][0]) >= {"status", "pid", "accel", "memory_bytes", "checkpoint", "url", "path"}'
jrun vmstop 0 env VMSNAP_RAM_DIR=/dev/shm "$VMSNAP" vm stop --json k --rm --state-dir "$SD"
keys vmstop 'j["name"] == "k" and j["op"] == "stop" and j["removed"] is True'
[ -e "$SD/vms/k" ] && fail "vm stop --rm left the record"

# ---- -f/--force: an existing destination is refused, naming it and the flag ----
echo precious >dst
for v in pack unpack; do
    src=$([ $v = pack ] && echo f || echo img)
    rc=0 && "$VMSNAP" $v "$src" dst 2>"$v-f.err" || rc=$?
    [ $rc = 1 ] && grep -q "dst exists: not replaced (-f/--force replaces it)" "$v-f.err" ||
        fail "$v over an existing file: exit $rc, $(cat "$v-f.err")"
    [ "$(cat dst)" = precious ] || fail "$v replaced an existing file without -f"
    "$VMSNAP" -q $v -f "$src" dst || fail "$v -f"
    echo precious >dst
done
"$VMSNAP" -q push f "$S/obj" || fail "push of a file"
jrun pullf 1 "$VMSNAP" pull --json "$S/obj" dst
keys pullf 'j["error"]["errno"] == "EEXIST"' '"-f/--force" in j["error"]["message"]'
[ "$(cat dst)" = precious ] || fail "pull replaced an existing file without -f"
"$VMSNAP" -q pull --force "$S/obj" dst && cmp -s f dst || fail "pull --force of one object"
# a set: refused when one of its names is there, whatever else the directory holds
"$VMSNAP" -q push set "$S/s2" || fail "push of the set"
mkdir -p into && echo mine >into/mine
"$VMSNAP" -q pull "$S/s2" into || fail "pull of a set into a directory without its names"
echo old >into/state.json # one of the set's names, now with other content
rc=0 && "$VMSNAP" pull "$S/s2" into 2>pset.err || rc=$?
[ $rc = 1 ] && grep -Eq "into/(memory|state.json) exists: not replaced \(-f/--force replaces the set's files there\)" pset.err ||
    fail "pull of a set over its names: exit $rc, $(cat pset.err)"
[ "$(cat into/state.json)" = old ] || fail "a refused pull replaced a file"
"$VMSNAP" -q pull -f "$S/s2" into && cmp -s set/state.json into/state.json && [ "$(cat into/mine)" = mine ] ||
    fail "pull -f of a set"
rc=0 && "$VMSNAP" disk create --size 16M d.img 2>dc.err || rc=$?
[ $rc = 1 ] && grep -q "d.img: already exists (use --force to replace)" dc.err || fail "disk create over an image: $(cat dc.err)"
"$VMSNAP" -q disk create -f --size 16M d.img || fail "disk create -f"

# ---- -T N: codec threads, 0 = all CPUs; the output is the same for any count ----
"$VMSNAP" -q pack -T0 f t0.img && "$VMSNAP" -q pack -T 1 f t1.img && cmp -s t0.img t1.img ||
    fail "pack -T0 and -T1 differ"
"$VMSNAP" -q unpack -T0 t0.img t0.out && cmp -s f t0.out || fail "unpack -T0"
"$VMSNAP" -q push -T0 -j 2 f "$S/t0" && "$VMSNAP" -q pull -T0 "$S/t0" t0.pull && cmp -s f t0.pull ||
    fail "push/pull -T0"
rc=0 && "$VMSNAP" pack -T 257 f t2.img 2>/dev/null || rc=$?
[ $rc = 2 ] || fail "-T 257: exit $rc, want 2"

# ---- -q, -v, -vv anywhere ----
for q in "-q pack -f f q.img" "pack -q -f f q.img" "pack -f f q.img -q" "--quiet pack -f f q.img"; do
    # shellcheck disable=SC2086
    "$VMSNAP" $q 2>q.err || fail "vmsnap $q"
    [ -s q.err ] && fail "vmsnap $q printed: $(cat q.err)"
done
mkdir -p "$SD/vms/k" && cp "$T/k.json" "$SD/vms/k/vm.json" # (vm ls of no VMs: UBSan's qsort(NULL))
for q in "-q vm ls" "vm -q ls" "vm ls -q" "vm ls --quiet"; do
    # shellcheck disable=SC2086
    env VMSNAP_RAM_DIR=/dev/shm "$VMSNAP" $q --state-dir "$SD" >/dev/null 2>q.err || fail "vmsnap $q: $(cat q.err)"
done
for v in "-vv disk create -f --size 16M d.img" "disk -vv create -f --size 16M d.img" \
    "disk create -vv -f --size 16M d.img" "disk create -v -v -f --size 16M d.img"; do
    # shellcheck disable=SC2086
    "$VMSNAP" $v 2>v.err || fail "vmsnap $v"
    grep -q "vmsnap: debug:" v.err || fail "vmsnap $v: no debug lines: $(cat v.err)"
done
"$VMSNAP" -v disk create -f --size 16M d.img 2>v.err && ! grep -q "debug:" v.err || fail "-v shows debug"

# ---- the progress line on a terminal: populated bytes, a percentage, cleared at the end ----
if script -qec true /dev/null >/dev/null 2>&1; then
    script -qec "'$VMSNAP' pack -f sparse tty.img" tty.log >/dev/null || fail "pack on a pty"
    grep -q "pack: 1.00 MiB / 1.00 MiB (100%" tty.log ||
        fail "progress does not count populated bytes: $(tr '\r' '\n' <tty.log | head -5)"
    grep -q $'\033\\[K' tty.log || fail "progress line never cleared"
else
    fail "script(1) cannot give the pack a terminal"
fi

# ---- access denied, unreachable: the S3 store ----
[ -z "$LOCAL_IO" ] || skip "$LOCAL_IO"
[ -n "${VMSNAP_RGW_STATE:-}" ] && [ -f "$VMSNAP_RGW_STATE/env" ] ||
    skip "no RGW (the xfer_rgw fixture): access denied with wrong keys not provoked"
. "$SRC/tests/integration/xfer_s3_lib.sh"
jrun s3ok 0 "$VMSNAP" push --json f "s3://$BUCKET/f"
jrun ad2 4 env AWS_SECRET_ACCESS_KEY=wrong "$VMSNAP" pull --json "s3://$BUCKET/f" ad2.dst
keys ad2 'j["error"]["errno"] == "EACCES"' '"SignatureDoesNotMatch" in j["error"]["message"]'
! grep -q wrong ad2.out ad2.err || fail "the wrong secret appears in the output"
jrun ad3 4 env AWS_ACCESS_KEY_ID=nobody "$VMSNAP" ls --json "s3://$BUCKET/"
keys ad3 '"InvalidAccessKeyId" in j["error"]["message"] and j["sets"] == []'
jrun nf7 3 "$VMSNAP" pull --json "s3://$BUCKET/none" nf7.dst
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
jrun ur1 5 "$VMSNAP" ls --json --retries 0 --endpoint "http://127.0.0.1:$port" "s3://$BUCKET/"
keys ur1 'j["error"]["errno"] == "ECONNREFUSED"' 'j["error"]["url"] == "s3://'"$BUCKET"'/"'
start_proxy "1+:503"
jrun ur2 5 "$VMSNAP" pull --json --retries 1 --endpoint "$PEP" "s3://$BUCKET/f" ur2.dst
keys ur2 'j["error"]["errno"] == "EAGAIN"' '"503" in j["error"]["message"]'
start_proxy "1+:reset"
jrun ur3 5 "$VMSNAP" pull --json --retries 1 --endpoint "$PEP" "s3://$BUCKET/f" ur3.dst
keys ur3 'j["error"]["errno"] == "ECONNRESET"'
stop_proxy
done_tests
