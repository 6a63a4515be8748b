#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Hostile names kept off the terminal: every path of the CLI that prints a name from a store, a
# manifest or the file system, driven with names holding terminal escapes (an OSC that sets the
# title, CSI sequences), an 8-bit CSI (U+009B) and bytes that are not UTF-8 (0xff). In every
# output, stdout and stderr, text and JSON: no raw control byte (0x00-0x1f but \n and \t, 0x7f),
# no C1 control (U+0080-U+009F), valid UTF-8; JSON parses. Text shows such a byte as \xHH
# (cli_printable), JSON as \u00XX for a control and as the visible \xHH for a byte that is not
# UTF-8. Local store only.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/lib.sh"
S=$T/store
mkdir -p "$S"

OSC=$'\033]0;T\a\033[2J' # sets the terminal's title, clears the screen
CSI=$'\xc2\x9b'           # U+009B, a terminal's 8-bit CSI, as UTF-8
CLR=$'\033[2Jc'           # clears the screen
BAD=$'a\xffb'             # not UTF-8
# how cli_printable shows them
OSC_T='\x1b]0;T\x07\x1b[2J'
CSI_T='\xc2\x9b'
CLR_T='\x1b[2Jc'
BAD_T='a\xffb'

# check FILE [json]: the output is terminal-safe UTF-8 (and parses as one JSON document)
check() {
    python3 - "$@" <<'EOF' || fail "$(basename "$1"): $(head -c 400 "$1" | od -c | head -5)"
import json, sys
data = open(sys.argv[1], "rb").read()
try:
    text = data.decode("utf-8")
except UnicodeDecodeError as e:
    sys.exit(f"invalid UTF-8 at byte {e.start}: {data[max(0, e.start - 30):e.start + 30]!r}")
for i, c in enumerate(text):
    o = ord(c)
    if (o < 0x20 and c not in "\n\t") or o == 0x7F or 0x80 <= o <= 0x9F:
        sys.exit(f"raw control U+{o:04X} at character {i}: {text[max(0, i - 30):i + 30]!r}")
if len(sys.argv) > 2:
    try:
        json.loads(text)
    except ValueError as e:
        sys.exit(f"not JSON: {e}")
EOF
}
# run NAME RC [json] -- CMD...: run CMD (exit status RC), its stdout in $T/NAME.out, its stderr
# in $T/NAME.err, both checked (stdout as JSON with json)
run() {
    local name=$1 want=$2 json=
    shift 2
    if [ "$1" = json ]; then json=json; shift; fi
    [ "$1" = -- ] && shift
    local rc=0
    "$@" >"$T/$name.out" 2>"$T/$name.err" </dev/null || rc=$?
    [ "$rc" = "$want" ] || fail "$name: exit $rc, want $want ($(head -c 300 "$T/$name.err"))"
    check "$T/$name.out" $json
    check "$T/$name.err"
}
# shows NAME out|err TEXT: that output holds TEXT (the escaped name: the path was driven)
shows() {
    grep -qF -- "$3" "$T/$1.$2" || fail "$1: $2 lacks '$3': $(head -c 300 "$T/$1.$2")"
}
# jfield NAME PYTHON-EXPR: the value of an expression on j, the parsed stdout of NAME
jfield() {
    python3 -c 'import json,sys; j=json.loads(open(sys.argv[1],"rb").read().decode()); print(eval(sys.argv[2]))' \
        "$T/$1.out" "$2"
}

# ---- transfer verbs ----
mkdir -p "$T/set" && head -c 100000 /dev/urandom >"$T/set/memory" && echo x >"$T/set/base-id"
"$VMSNAP" -q push "$T/set" "$S/good" || fail "push of the good set"

# pull's refusal of a name a manifest gives: the name is escaped (it was echoed byte for byte)
cp -r "$S/good" "$S/h1"
printf '{"snapshotFiles":["\\u001b]0;T\\u0007\\u001b[2J"]}' >"$S/h1/manifest.json"
run pull-refused 6 -- "$VMSNAP" pull "$S/h1" "$T/h1.out"
shows pull-refused err "$OSC_T"
# a name holding U+009B (an 8-bit CSI), its object missing
cp -r "$S/good" "$S/h2"
printf '{"snapshotFiles":["a\\u009bb"]}' >"$S/h2/manifest.json"
run pull-c1 3 -- "$VMSNAP" pull "$S/h2" "$T/h2.out"
shows pull-c1 err "a${CSI_T}b"

# sets whose names hold such bytes: push and pull --json (path, url), ls, rm
mkdir -p "$T/src$BAD" && cp "$T/set/"* "$T/src$BAD/" && echo h >"$T/src$BAD/.hid$CLR"
run push-json 0 json -- "$VMSNAP" push --json "$T/src$BAD" "$S/s$CLR"
[ "$(jfield push-json 'j["path"].endswith("srca" + chr(92) + "xffb")')" = True ] ||
    fail "push --json path: $(cat "$T/push-json.out")"
[ "$(jfield push-json 'j["url"].endswith("s\x1b[2Jc")')" = True ] ||
    fail "push --json url: $(cat "$T/push-json.out")"
shows push-json err ".hid$CLR_T" # the library's warning about the hidden file, logged
run push-text 0 -- "$VMSNAP" push "$T/src$BAD" "$S/s$BAD"
run push-c1 0 -- "$VMSNAP" -q push "$T/set" "$S/s$CSI"
run pull-json 0 json -- "$VMSNAP" pull --json "$S/s$BAD" "$T/dst$OSC"
[ "$(jfield pull-json 'j["path"].endswith("dst\x1b]0;T\x07\x1b[2J")')" = True ] ||
    fail "pull --json path: $(cat "$T/pull-json.out")"
run ls-text 0 -- "$VMSNAP" ls "$S"
shows ls-text out "s$BAD_T"
shows ls-text out "s$CLR_T"
shows ls-text out "s$CSI_T"
run ls-json 0 json -- "$VMSNAP" ls --json "$S"
[ "$(jfield ls-json 'sorted(s["url"].rsplit("/", 1)[1] for s in j["sets"])')" = \
    "['good', 'h1', 'h2', 's\x1b[2Jc', 'sa\\\\xffb', 's\x9b']" ] ||
    fail "ls --json urls: $(jfield ls-json 'sorted(s["url"].rsplit("/", 1)[1] for s in j["sets"])')"
run rm-set 0 -- "$VMSNAP" rm "$S/s$CLR"
shows rm-set err "s$CLR_T"
# rm --force of an incomplete set names the first object it kept (a key from the store)
mkdir -p "$S/inc" && echo junk >"$S/inc/k$CLR.zstd" && "$VMSNAP" -q pack "$T/set/base-id" "$S/inc/base-id.zstd"
run rm-kept 0 -- "$VMSNAP" rm --force "$S/inc"
shows rm-kept err "k$CLR_T.zstd"
run rm-missing 3 -- "$VMSNAP" rm "$S/none$OSC"
shows rm-missing err "none$OSC_T"
# gc lists what a killed push left (its mark) under a prefix named with escapes
mkdir -p "$S/g$CLR" && id=0123456789abcdef0123456789abcdef
printf '{"vmsnapPush":1,"pushId":"%s","started":1000,"files":["x"]}' "$id" \
    >"$S/g$CLR/vmsnap-push-$id.json"
run gc-dry 0 -- "$VMSNAP" gc --dry-run --older-than 0 "$S/g$CLR"
shows gc-dry out "g$CLR_T"
run gc-v 0 -- "$VMSNAP" -v gc --older-than 0 "$S/g$CLR"
shows gc-v err "g$CLR_T"

# ---- the codec ----
"$VMSNAP" -q pack "$T/set/memory" "$T/i$CLR.vs" && cp "$T/i$CLR.vs" "$T/i$BAD.vs" || fail "pack"
run inspect-text 0 -- "$VMSNAP" inspect "$T/i$CLR.vs"
shows inspect-text out "i$CLR_T.vs"
run inspect-json 0 json -- "$VMSNAP" inspect --json "$T/i$BAD.vs"
[ "$(jfield inspect-json 'j["path"].endswith("ia" + chr(92) + "xffb.vs")')" = True ] ||
    fail "inspect --json path: $(cat "$T/inspect-json.out")"
run inspect-missing 3 -- "$VMSNAP" inspect "$T/none$OSC"
shows inspect-missing err "none$OSC_T"
run unpack-missing 3 -- "$VMSNAP" unpack "$T/none$CLR" "$T/o"
shows unpack-missing err "none$CLR_T"
run pack-missing 3 -- "$VMSNAP" pack "$T/none$BAD" "$T/o"
shows pack-missing err "none$BAD_T"

# ---- page cache ----
mkdir -p "$T/c" && echo a >"$T/c/$CLR" && echo b >"$T/c/$BAD" && echo c >"$T/c/$CSI"
run cache-text 0 -- "$VMSNAP" cache stat "$T/c/$CLR"
shows cache-text out "$CLR_T"
run cache-json 0 json -- "$VMSNAP" cache stat --json "$T/c/$BAD"
[ "$(jfield cache-json 'j["files"][0]["path"].endswith("/a" + chr(92) + "xffb")')" = True ] ||
    fail "cache stat --json path: $(cat "$T/cache-json.out")"
run cache-dir 0 -- "$VMSNAP" cache stat "$T/c"
shows cache-dir out "$BAD_T"
shows cache-dir out "$CSI_T"
run cache-dir-json 0 json -- "$VMSNAP" cache stat --json "$T/c"
run cache-missing 3 -- "$VMSNAP" cache stat "$T/none$OSC"
shows cache-missing err "none$OSC_T"
run evict-missing 3 -- "$VMSNAP" cache evict "$T/none$OSC"
shows evict-missing err "none$OSC_T"

# ---- disks ----
run disk-create 0 -- "$VMSNAP" disk create --size 8M "$T/d$CLR.img"
run disk-info 0 -- "$VMSNAP" disk info "$T/d$CLR.img"
shows disk-info out "d$CLR_T.img"
cp "$T/d$CLR.img" "$T/d$BAD.img"
run disk-info-json 0 json -- "$VMSNAP" disk info --json "$T/d$BAD.img"
[ "$(jfield disk-info-json 'j["path"].endswith("da" + chr(92) + "xffb.img")')" = True ] ||
    fail "disk info --json path: $(cat "$T/disk-info-json.out")"
# a label is bytes from the image: in JSON a control as \u00XX, as every name (it went as the
# visible \x1b there, unlike every other name)
"$VMSNAP" disk create --size 8M --label "l$CLR" "$T/lab.img" || fail "disk create with a label"
run disk-label-json 0 json -- "$VMSNAP" disk info --json "$T/lab.img"
[ "$(jfield disk-label-json 'j["label"] == "l\x1b[2Jc"')" = True ] ||
    fail "disk info --json label: $(cat "$T/disk-label-json.out")"
run disk-label 0 -- "$VMSNAP" disk info "$T/lab.img"
shows disk-label out "l$CLR_T"
run disk-add-missing 3 -- "$VMSNAP" disk create --size 8M --add "$T/none$OSC:/x" "$T/e.img"
shows disk-add-missing err "none$OSC_T"
run disk-clone-v 0 -- "$VMSNAP" disk clone -v "$T/d$CLR.img" "$T/e$BAD.img"
shows disk-clone-v err "e$BAD_T.img"
run disk-info-missing 3 -- "$VMSNAP" disk info "$T/none$CSI"
shows disk-info-missing err "none$CSI_T"

# ---- VM records (no VM runs: a record read from the state directory) ----
SD="$T/state$BAD$CLR"
mkdir -p "$SD/vms/k"
printf '{"name":"k","status":"stopped","url":"s3://b/%s","accel":"tcg%s","mem":536870912}' \
    '\u009b\u001b]0;x\u0007' '\u009b' >"$SD/vms/k/vm.json"
run vm-ls 0 -- env VMSNAP_RAM_DIR=/dev/shm "$VMSNAP" vm ls --state-dir "$SD"
shows vm-ls out "s3://b/$CSI_T"
run vm-ls-json 0 json -- env VMSNAP_RAM_DIR=/dev/shm "$VMSNAP" vm ls --json --state-dir "$SD"
[ "$(jfield vm-ls-json 'j["vms"][0]["path"].endswith("a" + chr(92) + "xffb\x1b[2Jc/vms/k")')" = True ] ||
    fail "vm ls --json path: $(cat "$T/vm-ls-json.out")"
run vm-console 3 -- env VMSNAP_RAM_DIR=/dev/shm "$VMSNAP" vm console k --state-dir "$SD"
shows vm-console err "$BAD_T$CLR_T"

done_tests
