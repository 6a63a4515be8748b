#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Every message of the CLI, the stores and the transfer that advises a command (issue #22): the
# state that prints it is provoked for real (a push whose store refuses a write or a delete midway:
# chattr +i on a directory of the local store, which even root cannot write past, lifted once the
# message is printed, as a store that comes back; a corrupt manifest; a set where a file is pushed;
# a fault proxy in front of a real RGW), the message is checked, and the command it advises, as it
# spells it, is run: it must exit 0 and leave what the message promises. The VM messages are
# vm_advice.sh's. The table below lists every advising message under cli/ and lib/ (but lib/vm/)
# with the case that covers it; a message the table does not know fails the test.
. "${VMSNAP_SRC:?run through ctest (VMSNAP_SRC, VMSNAP_BIN)}/tests/lib.sh"
. "$SRC/tests/integration/advice_lib.sh"

# FILE^COMMAND (as the source spells it)^FRAGMENT of the message^CASE
ADVICE_TABLE="
cli/cmd_cache.c^'vmsnap cache stat --help'^usage: vmsnap cache stat^help
cli/cmd_cache.c^'vmsnap help cache'^usage: vmsnap cache stat^help
cli/cmd_vm.c^'vmsnap vm run --help'^usage: vmsnap vm run^help
cli/cmd_vm.c^'vmsnap help vm'^usage: vmsnap vm run^help
cli/main.c^'vmsnap help VERB'^one JSON object on stdout, failures included^help
cli/main.c^'vmsnap help'^unknown verb (the verbs^unknown_verb
lib/xfer/xfer_layers_push.c^'vmsnap gc'^whether the commit was carried out cannot be told^none: needs a PUT carried out whose answer is lost and a read-back refused; the review reproduced it through the fault proxy (M1:drop,M2:503), and gc then keeps the objects the committed manifest names (xfer_layers: gc keeps what manifests name)
cli/util.c^'vmsnap help %s'^(see 'vmsnap help %s')^usage
cli/main.c^'vmsnap cache objects|trim'^Download and decode a snapshot set^cache
lib/xfer/xfer_ctx.c^'vmsnap inspect'^not a directory of sets^object_url
lib/xfer/xfer_ctx.c^'vmsnap pull'^not a directory of sets^object_url
lib/xfer/xfer_gc_reach.c^'vmsnap rm --force'^cannot be read, so what it names^corrupt_manifest
lib/xfer/xfer_push.c^'vmsnap rm %s'^hidden by it; remove the set first^file_over_set
lib/xfer/xfer_push.c^'vmsnap rm %s'^its layers keep the directory^file_over_layered
lib/xfer/xfer_push.c^'vmsnap gc %s'^its layers keep the directory^file_over_layered
lib/xfer/xfer_push.c^'vmsnap rm --force %s'^its layers keep the directory^file_over_layered
lib/xfer/xfer_rm.c^'vmsnap gc'^its layer objects stay until^rm_layered
lib/xfer/xfer_layers_push.c^'vmsnap gc'^objects of this push could not be removed^layered_undo
lib/xfer/xfer_upload.c^'vmsnap gc'^cannot abort the upload of^upload_abort
lib/xfer/xfer_set_push.c^'vmsnap gc'^cannot abort the upload of^held_abort
lib/xfer/xfer_set_undo.c^'vmsnap gc'^this push's mark stays for 'vmsnap gc' to finish^held_abort
lib/xfer/xfer_marks.c^'vmsnap gc'^of earlier pushes stay for^dead_mark
lib/xfer/xfer_set_undo.c^'vmsnap gc'^of the replaced set that this push does not have^dead_mark
lib/xfer/xfer_layers_push.c^'vmsnap rm %s'^holds a single object^s3_object_prefix
lib/xfer/xfer_set_push.c^'vmsnap rm %s'^holds a single object^s3_object_prefix_ref
lib/xfer/xfer_upload.c^'vmsnap gc'^cannot list unfinished uploads^s3_list_uploads
lib/xfer/xfer_set_push.c^'vmsnap gc'^cannot tell whether the set there is still committed^s3_uncommit_unknown
lib/xfer/xfer_push.c^'vmsnap gc'^cannot remove the test object^elsewhere: only a vm suspend tests a store before its push; vm_advice.sh's case probe_left provokes this message and runs the gc it names
lib/store/s3/s3_request.c^'vmsnap gc'^no such multipart upload^none: names gc as a cause of a lost upload (it advises nothing to run); the state is s3_nsu's
"
ADVICE_EXCLUDE=lib/vm/ advice_check_table cli lib
[ "$fails" = 0 ] || done_tests

S=$T/store
mkdir -p "$S"
# stopped PID; run as a job: $! its pid
# old_all DIR: every file under DIR two hours old (gc's grace period, 1 h, past, as for a
# store that a cron gc visits later)
old_all() { find "$1" -exec touch -h -d '2 hours ago' {} +; }
# err_url FILE VERB TAIL: the URL an error "vmsnap VERB: URL: TAIL..." names
err_url() { sed -n "s/^vmsnap $2: \(.*\): $3.*/\1/p" "$1" | head -n1; }
# immutable PATH...: chattr +i (lifted by mutable, and at exit whatever happened)
IMMUTABLE=()
immutable() { chattr +i "$@" && IMMUTABLE+=("$@"); }
mutable() { chattr -i "$@"; }
at_exit 'for p in ${IMMUTABLE[@]+"${IMMUTABLE[@]}"}; do chattr -i "$p" 2>/dev/null; done'
mkdir -p "$T/ct" && chattr +i "$T/ct" 2>/dev/null && ! touch "$T/ct/x" 2>/dev/null && chattr -i "$T/ct" ||
    skip "chattr +i does not stop writes under $T (the refusing store cannot be made here)"
# stop_at FAILPOINT CMD...: run CMD (stderr in $T/err) until it stops at FAILPOINT; its pid in
# $SPID (status 1 when it never stopped)
stop_at() {
    local fp=$1
    shift
    VMSNAP_FAILPOINT=$fp:stop "$@" 2>"$T/err" &
    SPID=$!
    wait_stopped "$SPID" 60 || { fail "$* did not stop at $fp: $(cat "$T/err")"; kill_wait "$SPID"; return 1; }
}
# go_on: let the stopped job run to its end; its status in $grc
go_on() { kill -CONT "$SPID"; grc=0 && wait "$SPID" || grc=$?; }

mkdir -p "$T/set" "$T/set2"
mk "$T/set/memory-ranges" $((1024 * 1024)) && echo s1 >"$T/set/state.json"
mk "$T/set2/memory-ranges" $((1024 * 1024)) && echo s2 >"$T/set2/state.json"
same_set() { rm -rf "$T/got" && "$VMSNAP" -q pull "$1" "$T/got" && diff -r "$2" "$T/got" >/dev/null; }

# --- help: the usages that point at another help (cli/cmd_cache.c, cli/cmd_vm.c, cli/main.c)
"$VMSNAP" cache --help >"$T/err" || fail "cache --help"
c=$(advised "$T/err" "vmsnap cache stat") && run_advised "cache --help" "$c" &&
    grep -q '^usage: vmsnap cache stat' "$T/adv.out" || fail "$c: $(head -c 300 "$T/adv.out")"
c=$(advised "$T/err" "vmsnap help") && run_advised "cache --help" "$c" &&
    grep -q '^usage: vmsnap cache stat' "$T/adv.out" || fail "$c: $(head -c 300 "$T/adv.out")"
"$VMSNAP" vm --help >"$T/err" || fail "vm --help"
c=$(advised "$T/err" "vmsnap vm run") && run_advised "vm --help" "$c" &&
    grep -q '^usage: vmsnap vm run NAME' "$T/adv.out" || fail "$c: $(head -c 300 "$T/adv.out")"
c=$(advised "$T/err" "vmsnap help") && run_advised "vm --help" "$c" &&
    grep -q '^usage: vmsnap vm run|' "$T/adv.out" || fail "$c: $(head -c 300 "$T/adv.out")"
# the verbs' list: 'vmsnap help VERB' for every verb it lists
"$VMSNAP" >"$T/err" 2>&1 || true
c=$(advised "$T/err" "vmsnap help") || true
verbs=$(sed -n 's/^  \([a-z]\+\)\( .*\)\?$/\1/p' "$T/err")
[ "$(echo "$verbs" | wc -w)" -ge 10 ] || fail "the usage lists no verbs: $(cat "$T/err")"
for v in $verbs; do
    run_advised "usage" "$(placeholder VERB "$v" "$c")" &&
        grep -q "^usage: vmsnap $v" "$T/adv.out" || fail "'$c' for $v: $(head -c 300 "$T/adv.out")"
done
advice_seen help
# --- usage: a bad option of every verb that takes options (cli/util.c)
for v in $verbs; do
    rc=0 && "$VMSNAP" "$v" --no-such-option >/dev/null 2>"$T/err" || rc=$?
    [ "$v" = version ] && continue # (takes no option: ignores it)
    [ "$v" = help ] && continue    # (help --x asks for the verb '--x': the unknown_verb case)
    [ "$rc" = 2 ] || { fail "$v --no-such-option: exit $rc"; continue; }
    c=$(advised "$T/err" "vmsnap help $v") && run_advised "$v usage" "$c" &&
        grep -q "^usage: vmsnap $v" "$T/adv.out" || fail "'$c': $(head -c 300 "$T/adv.out")"
done
advice_seen usage
# --- an unknown verb that is near none: the list of verbs (cli/main.c)
rc=0 && "$VMSNAP" zzqqxx >/dev/null 2>"$T/err" || rc=$?
[ "$rc" = 2 ] || fail "unknown verb: exit $rc"
c=$(advised "$T/err" "vmsnap help") && run_advised "unknown verb" "$c" &&
    grep -q "push" "$T/adv.out" || fail "'$c' after an unknown verb: $(head -c 300 "$T/adv.out")"
advice_seen unknown_verb
# --- pull's help names the node cache's verbs (cli/main.c): both run on the cache it means
export VMSNAP_CACHE_DIR=$T/cache
"$VMSNAP" help pull >"$T/err"
c=$(advised "$T/err" "vmsnap cache objects|trim") && {
    for sub in objects trim; do
        run_advised "help pull" "${c/objects|trim/$sub}" || true
    done
    [ -d "$T/cache/objects" ] || fail "'$c' did not use the cache \$VMSNAP_CACHE_DIR names"
    advice_seen cache
}

# --- a local URL that is an object, given to ls and gc (lib/xfer/xfer_ctx.c): inspect and pull
# it, as the message says, and get the file back
mk "$T/file" 300000
"$VMSNAP" -q push "$T/file" "$S/obj" || fail "push of an object"
for verb in ls gc; do
    expect_fail "$verb of an object" "$VMSNAP" "$verb" "$S/obj"
    u=$(err_url "$T/err" "$verb" "not a directory of sets")
    [ "$u" = "$S/obj" ] || { fail "$verb of an object names '$u': $(cat "$T/err")"; continue; }
    c=$(advised "$T/err" "vmsnap inspect") && run_advised "$verb of an object" "$c $u" &&
        grep -q 'logical size:.*300000 bytes' "$T/adv.out" || fail "'$c $u': $(cat "$T/adv.out")"
    c=$(advised "$T/err" "vmsnap pull") && rm -f "$T/back" && run_advised "$verb of an object" "$c $u $T/back" &&
        cmp -s "$T/file" "$T/back" || fail "'$c $u' does not give the file back"
done
advice_seen object_url

# --- a corrupt manifest stops gc (lib/xfer/xfer_gc_reach.c): rm --force removes it, gc then runs,
# and the other set (layered, beside it) still pulls whole
"$VMSNAP" -q push "$T/set" "$S/g/good" && "$VMSNAP" -q push "$T/set2" "$S/g/bad" || fail "push of the gc sets"
printf '{"formatVersion":3,"files":[' >"$S/g/bad/manifest.json"
expect_fail "gc over a corrupt manifest" "$VMSNAP" gc "$S/g"
m=$(sed -n "s/.*the manifest \(.*\) cannot be read.*/\1/p" "$T/err")
[ "$m" = "$S/g/bad/manifest.json" ] || fail "gc over a corrupt manifest names '$m': $(cat "$T/err")"
c=$(advised "$T/err" "vmsnap rm --force") && run_advised "corrupt manifest" "$c ${m%/manifest.json}" && {
    [ -e "$m" ] && fail "'$c ${m%/manifest.json}' left the corrupt manifest"
    old_all "$S/g"
    "$VMSNAP" gc "$S/g" 2>"$T/gc" || fail "gc after '$c': $(cat "$T/gc")"
    [ -z "$(find "$S/g/bad" -type f 2>/dev/null)" ] || fail "gc left the corrupt set's layers: $(find "$S/g/bad")"
    same_set "$S/g/good" "$T/set" || fail "the set beside the corrupt one does not pull whole"
    advice_seen corrupt_manifest
}

# --- a file pushed where a set is (lib/xfer/xfer_push.c): the reference layout's set goes with
# its rm; a layered set's layers keep its directory (local store) until gc has them, then the
# emptied directory goes with an rm. Either way the file is pushed after what it says, and pulls.
VMSNAP_LAYOUT=reference "$VMSNAP" -q push "$T/set" "$S/f/ref" || fail "push of a reference set"
expect_fail "file over a reference set" "$VMSNAP" push "$T/file" "$S/f/ref"
c=$(advised "$T/err" "vmsnap rm") && [ "$c" = "vmsnap rm $S/f/ref" ] && run_advised "file over a set" "$c" &&
    "$VMSNAP" -q push "$T/file" "$S/f/ref" 2>"$T/err" && rm -f "$T/back" && "$VMSNAP" -q pull "$S/f/ref" "$T/back" &&
    cmp -s "$T/file" "$T/back" && advice_seen file_over_set || fail "file over a reference set, after '$c': $(cat "$T/err")"
"$VMSNAP" -q push "$T/set" "$S/f/lay" || fail "push of a layered set"
expect_fail "file over a layered set" "$VMSNAP" push "$T/file" "$S/f/lay"
mapfile -t cmds < <(grep -o "'vmsnap [^']*'" "$T/err" | tr -d "'")
if [ "${#cmds[@]}" = 3 ] && [ "${cmds[0]}" = "vmsnap rm $S/f/lay" ] && [ "${cmds[1]}" = "vmsnap gc $S/f/lay" ]; then
    run_advised "file over a layered set" "${cmds[0]}" || true
    old_all "$S/f/lay" # (the grace period past)
    run_advised "file over a layered set" "${cmds[1]}" || true
    run_advised "file over a layered set" "${cmds[2]}" || true
    "$VMSNAP" -q push "$T/file" "$S/f/lay" 2>"$T/err" && rm -f "$T/back" && "$VMSNAP" -q pull "$S/f/lay" "$T/back" &&
        cmp -s "$T/file" "$T/back" && advice_seen file_over_layered ||
        fail "file over a layered set, after ${cmds[*]}: $(cat "$T/err")"
else
    fail "file over a layered set: advises ${cmds[*]}: $(cat "$T/err")"
fi

# --- rm of a layered set (lib/xfer/xfer_rm.c): gc keeps its layers while they are younger than
# its grace period (a push in flight may name them), removes them past it, and keeps the
# layers a child set names
"$VMSNAP" -q push "$T/set" "$S/r/parent" && "$VMSNAP" -q push --parent "$S/r/parent" "$T/set2" "$S/r/child" ||
    fail "push of a parent and a child"
"$VMSNAP" -v rm "$S/r/parent" 2>"$T/err" || fail "rm of a layered set: $(cat "$T/err")"
c=$(advised "$T/err" "vmsnap gc") && {
    run_advised "rm of a layered set" "$c $S/r/parent" || true
    [ -n "$(find "$S/r/parent" -type f)" ] || fail "'$c' removed layers younger than its grace period"
    old_all "$S/r"
    run_advised "rm of a layered set" "$c $S/r" || true
    [ -z "$(find "$S/r/parent" -type f 2>/dev/null)" ] || fail "'$c' past the grace period left the layers: $(find "$S/r/parent")"
    same_set "$S/r/child" "$T/set2" || fail "the child of a removed set does not pull whole after '$c'"
    advice_seen rm_layered
}

# --- a layered push whose commit and clean-up the store refuses (lib/xfer/xfer_layers_push.c):
# what it stored stays for gc, which removes it past its grace period; the set there is intact
"$VMSNAP" -q push "$T/set" "$S/l" || fail "push of the layered set"
if stop_at layered-uploaded "$VMSNAP" push "$T/set2" "$S/l"; then
    pdir=$(ls -td "$S"/l/vmsnap-objects/*/ | head -n1)
    immutable "$S/l" "$pdir"
    go_on
    mutable "$S/l" "$pdir"
    is_failure "$grc" || fail "layered push refused its commit: exit $grc: $(cat "$T/err")"
    c=$(advised "$T/err" "vmsnap gc") && {
        u=$(sed -n "s/^vmsnap: warning: \(.*\): [0-9]* objects of this push could not be removed.*/\1/p" "$T/err")
        [ "$u" = "$S/l" ] || fail "the layered push's clean-up warning names '$u'"
        old_all "$S/l"
        run_advised "layered push refused" "$c $u" || true
        [ -e "$pdir" ] && fail "'$c $u' left the failed push's objects: $(ls -A "$pdir")"
        same_set "$S/l" "$T/set" || fail "the set a failed layered push left does not pull whole"
        advice_seen layered_undo
    }
fi

# --- an upload the store refuses to complete and to abort (lib/xfer/xfer_upload.c): caught in
# its parts (64 KiB), its directory made immutable; gc aborts it past its grace period
mkdir -p "$T/big" && mk "$T/big/memory-ranges" $((32 * 1024 * 1024))
in_upload() { find "$S/u" -name '.*.mpu-*' 2>/dev/null | grep -q .; }
"$VMSNAP" push -j 1 --part-size 64K --max-memory 128K "$T/big" "$S/u" 2>"$T/err" &
SPID=$!
if wait_for 30 in_upload; then
    kill -STOP $SPID
    udir=$(dirname "$(find "$S/u" -name '.*.mpu-*' | head -n1)")
    immutable "$udir"
    go_on
    mutable "$udir"
    is_failure "$grc" || fail "push whose upload the store refused: exit $grc: $(cat "$T/err")"
    c=$(advised "$T/err" "vmsnap gc") && {
        grep -q "cannot abort the upload of .*memory-ranges.zstd (run 'vmsnap gc')" "$T/err" ||
            fail "the upload's abort: $(cat "$T/err")"
        old_all "$S/u"
        run_advised "upload refused" "$c $S/u" || true
        [ -z "$(find "$S/u" -type f 2>/dev/null)" ] || fail "'$c' left: $(find "$S/u" -type f)"
        advice_seen upload_abort
    }
else
    kill_wait $SPID
    fail "the push of $T/big was not caught uploading: $(cat "$T/err")"
fi

# --- the reference layout (held uploads, push marks, the un-commit)
export VMSNAP_LAYOUT=reference
mkdir -p "$T/ra" "$T/rb" && echo a1 >"$T/ra/a" && echo b1 >"$T/ra/b" && echo a2 >"$T/rb/a" && echo c2 >"$T/rb/c"
# held uploads the store refuses to complete and to abort (lib/xfer/xfer_set_push.c), and a
# clean-up it refuses (lib/xfer/xfer_set_undo.c): the mark stays, and gc past its grace period
# finishes the clean-up: nothing of the push is left (the set it replaced was un-committed
# before the completions, the reference layout's known loss, which the layered layout avoids)
"$VMSNAP" -q push "$T/ra" "$S/h" || fail "push of the reference set"
if stop_at push-completing "$VMSNAP" push "$T/rb" "$S/h"; then
    immutable "$S/h"
    go_on
    mutable "$S/h"
    is_failure "$grc" || fail "push whose completions the store refused: exit $grc: $(cat "$T/err")"
    grep -q "cannot abort the upload of .*/h/a.zstd (run 'vmsnap gc')" "$T/err" ||
        fail "held upload's abort: $(cat "$T/err")"
    c=$(advised "$T/err" "vmsnap gc") && grep -q "$S/h: this push's mark stays for 'vmsnap gc' to finish" "$T/err" && {
        old_all "$S/h"
        run_advised "held uploads refused" "$c $S/h" || true
        [ -z "$(find "$S/h" 2>/dev/null)" ] || fail "'$c' left: $(find "$S/h")"
        advice_seen held_abort
    } || fail "the push whose clean-up was refused: $(cat "$T/err")"
fi
# a dead push's mark the next push cannot remove (lib/xfer/xfer_marks.c), so it leaves the
# replaced set's other objects too (lib/xfer/xfer_set_undo.c): gc removes the marks and what
# they name, the set stays whole
"$VMSNAP" -q push "$T/ra" "$S/m" || fail "push ra"
rc=0 && VMSNAP_FAILPOINT=push-committed "$VMSNAP" -q push "$T/rb" "$S/m" 2>/dev/null || rc=$?
[ $rc = 137 ] || fail "push killed after its commit: exit $rc"
dead=$(ls "$S"/m/vmsnap-push-*.json)
immutable "$dead"
"$VMSNAP" -v push "$T/ra" "$S/m" 2>"$T/err" || fail "push over a dead push's mark: $(cat "$T/err")"
mutable "$dead"
grep -q "$S/m: 1 mark of earlier pushes stay for 'vmsnap gc'" "$T/err" &&
    grep -q "$S/m: 1 object of the replaced set that this push does not have stay for 'vmsnap gc'" "$T/err" &&
    c=$(advised "$T/err" "vmsnap gc") && {
    old_all "$S/m"
    run_advised "dead mark kept" "$c $S/m" || true
    [ "$(ls -A "$S/m" | tr '\n' ' ')" = "a.zstd b.zstd manifest.json " ] || fail "'$c' left: $(ls -A "$S/m")"
    same_set "$S/m" "$T/ra" || fail "the set does not pull whole after '$c'"
    advice_seen dead_mark
} || fail "push over a dead push's mark: $(cat "$T/err")"
unset VMSNAP_LAYOUT

# --- S3 (a real RGW, the xfer_rgw fixture)
. "$SRC/tests/integration/xfer_s3_lib.sh"
B=s3://$BUCKET
# a set pushed where a single object is (lib/xfer/xfer_layers_push.c, lib/xfer/xfer_set_push.c):
# rm it, as said, and the set is pushed and pulls whole
for lay in layered reference; do
    k=obj-$lay
    "$VMSNAP" -q push "$T/file" "$B/$k" || fail "push of an object to $B/$k"
    expect_fail "set over an object ($lay)" "$VMSNAP" push --layout "$lay" "$T/set" "$B/$k"
    c=$(advised "$T/err" "vmsnap rm") && [ "$c" = "vmsnap rm $B/$k" ] && run_advised "set over an object" "$c" &&
        "$VMSNAP" -q push --layout "$lay" "$T/set" "$B/$k" 2>"$T/err" && same_set "$B/$k" "$T/set" &&
        advice_seen "s3_object_prefix$([ $lay = reference ] && echo _ref)" ||
        fail "set over an object ($lay), after '$c': $(cat "$T/err")"
done
# an upload whose sweep of leftovers the store refuses (lib/xfer/xfer_upload.c): the
# CreateMultipartUpload's answer lost (its retry starts a second upload; the first is a leftover
# nobody finishes), and every request from the sweep on answered 503. gc finds the leftover:
# kept while younger than its grace period (an S3 object's age cannot be faked here: --older-than
# 0 stands for the hour past), then aborted.
mk "$T/f12" $((12 * 1024 * 1024))
start_proxy "1+:delay0"
"$VMSNAP" -v -v push -j 1 --part-size 5M --endpoint "$PEP" "$T/f12" "$B/dry-o" 2>"$T/trace" || fail "dry push: $(cat "$T/trace")"
n=$(grep -c ' -> ' "$T/trace")
cmu=$(grep ' -> ' "$T/trace" | grep -n 'POST .*?uploads= ' | cut -d: -f1 | head -n1)
[ "$(grep ' -> ' "$T/trace" | sed -n "${n}p" | grep -c 'uploads=')" = 1 ] && [ -n "$cmu" ] ||
    fail "a push of one object no longer ends with its sweep: $(cat "$T/trace")"
start_proxy "$cmu:drop,$((n + 1))+:503"
VMSNAP_S3_ATTEMPTS=2 "$VMSNAP" push -j 1 --part-size 5M --endpoint "$PEP" "$T/f12" "$B/lo" 2>"$T/err" ||
    fail "push whose sweep is refused: $(cat "$T/err")"
stop_proxy
[ "$(uploads_left)" = 1 ] || fail "the lost CreateMultipartUpload left $(uploads_left) uploads, not 1"
c=$(advised "$T/err" "vmsnap gc") && grep -q "cannot list unfinished uploads of lo (run" "$T/err" && {
    run_advised "sweep refused" "$c $B/lo" && grep -q "kept 1 younger than" "$T/adv.err" ||
        fail "'$c $B/lo' did not find the leftover upload: $(cat "$T/adv.err")"
    "$VMSNAP" -q gc --older-than 0 "$B/lo" || fail "gc --older-than 0 $B/lo"
    [ "$(uploads_left)" = 0 ] || fail "gc past the grace period left $(uploads_left) uploads"
    rm -f "$T/back" && "$VMSNAP" -q pull "$B/lo" "$T/back" && cmp -s "$T/f12" "$T/back" ||
        fail "the object whose sweep was refused does not pull back"
    advice_seen s3_list_uploads
} || fail "push whose sweep was refused: $(cat "$T/err")"
# a reference push whose un-commit DELETE, and everything after it, the store refuses
# (lib/xfer/xfer_set_push.c): it cannot tell whether the set is still committed; its mark stays
# and gc, past the grace period, removes it and what it names: the set it replaced is whole
mkdir -p "$T/ra" "$T/rb" && echo a1 >"$T/ra/a" && echo b1 >"$T/ra/b" && echo a2 >"$T/rb/a" && echo c2 >"$T/rb/c"
"$VMSNAP" -q push --layout reference "$T/ra" "$B/dry-r" && "$VMSNAP" -q push --layout reference "$T/ra" "$B/r" ||
    fail "push of the reference sets"
start_proxy "1+:delay0"
"$VMSNAP" -v -v push -j 1 --layout reference --endpoint "$PEP" "$T/rb" "$B/dry-r" 2>"$T/trace" || fail "dry push: $(cat "$T/trace")"
stop_proxy
k=$(grep ' -> ' "$T/trace" | grep -n 'DELETE .*/dry-r/manifest.json ' | cut -d: -f1 | head -n1)
if [ -n "$k" ]; then
    start_proxy "$k+:reset"
    rc=0 && VMSNAP_S3_ATTEMPTS=2 "$VMSNAP" push -j 1 --layout reference --endpoint "$PEP" "$T/rb" "$B/r" 2>"$T/err" || rc=$?
    stop_proxy
    is_failure "$rc" || fail "push whose un-commit was refused: exit $rc: $(cat "$T/err")"
    c=$(advised "$T/err" "vmsnap gc") && grep -q "$B/r: cannot tell whether the set there is still committed" "$T/err" && {
        run_advised "un-commit refused" "$c $B/r" && grep -q "kept" "$T/adv.err" ||
            fail "'$c $B/r' did not find the mark: $(cat "$T/adv.err")"
        "$VMSNAP" -q gc --older-than 0 "$B/r" || fail "gc --older-than 0 $B/r"
        [ "$(keys_under r/ | tr '\n' ' ')" = "r/a.zstd r/b.zstd r/manifest.json " ] || fail "gc left: $(keys_under r/)"
        [ "$(uploads_left)" = 0 ] || fail "gc past the grace period left $(uploads_left) uploads"
        same_set "$B/r" "$T/ra" || fail "the set whose replacing push could not un-commit does not pull whole"
        advice_seen s3_uncommit_unknown
    } || fail "push whose un-commit was refused: $(cat "$T/err")"
else
    fail "a reference push over a set sends no un-commit DELETE: $(cat "$T/trace")"
fi

# the node cache's verbs after a pull from S3: the layers it fetched are listed, and a trim to
# nothing empties it
"$VMSNAP" cache objects >"$T/co" && grep -q ' t-' "$T/co" || fail "cache objects after an S3 pull: $(cat "$T/co")"

advice_check_seen
done_tests
