#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Layered snapshots against today's full push, one run, a co-located Ceph RGW started here, the
# test guest (512 MiB, a 64 MiB random blob at boot). Each mode suspends a golden, then CYCLES
# times (default 10, the reference system's glutton cycle): resume the last set, dirty 64 MiB
# inside the guest, suspend to a new set made from it:
#   layers       the default layout: a delta over the set the VM came from (only changed pages)
#   full-base    --layout reference with the previous set as base (unchanged frames copied by RGW)
#   full-nobase  --layout reference --no-base (every frame compressed and uploaded)
# Per cycle: bytes uploaded (the suspend's objects) and downloaded (the resume's objects minus
# what came from the node's cache), suspend and resume wall time, client and server CPU; for
# layers also the resume of each new set on "another node" (its own cache dir, holding the
# parent chain: it resumed every earlier set), which fetches the delta only. Then
# the store's bytes per mode, 8 resumes of one golden on one node with an empty cache (bytes
# fetched in all), and the resume time of each set of the layered chain with an empty cache
# against its depth. Prints markdown tables.
#
#   bench/layers.sh [BUILD_DIR]     env: CYCLES=10 MODES="layers full-base full-nobase"
#                                        DIRTY_MIB=64 BENCH_DIR=/var/tmp
# Runs under TCG here (no vmx/svm): the figures are for ratios, not absolute claims.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$here/build}
. "$here/bench/lib.sh" # server_cpu
VMSNAP=$BUILD/vmsnap
CYCLES=${CYCLES:-10}
MODES=${MODES:-layers full-base full-nobase}
DIRTY=${DIRTY_MIB:-64}
[ -x "$VMSNAP" ] || { echo "bench/layers.sh: build first ($VMSNAP missing)" >&2; exit 1; }
command -v radosgw >/dev/null || { echo "bench/layers.sh: needs Ceph (scripts/deps.sh s3)" >&2; exit 1; }
G=$(bash "$here/guest/build.sh")
W=$(mktemp -d "${BENCH_DIR:-/var/tmp}/vmsnap-layersbench.XXXXXX")
S=$W/state
RGW=$W/rgw
export VMSNAP_RAM_DIR=$W/ram VMSNAP_ASSET_DIRS=$G
mkdir -p "$VMSNAP_RAM_DIR"
mount -t tmpfs -o size=6G tmpfs "$VMSNAP_RAM_DIR"
cleanup() {
    local n
    for n in $(ls "$S/vms" 2>/dev/null); do "$VMSNAP" vm stop --rm --state-dir "$S" "$n" >/dev/null 2>&1 || true; done
    bash "$here/tests/rgw-down.sh" "$RGW" >/dev/null 2>&1 || true
    umount "$VMSNAP_RAM_DIR" 2>/dev/null || true
    rm -rf "$W"
}
trap cleanup EXIT
bash "$here/tests/rgw-up.sh" "$RGW" >"$W/rgw.log" 2>&1 || { echo "RGW did not start" >&2; exit 1; }
. "$RGW/env"
export AWS_ENDPOINT_URL AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
BUCKET=layersbench-$$
s3() { # METHOD PATH: curl's own signer; prints the body
    curl -sS --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
        -H "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" \
        -X "$1" "$AWS_ENDPOINT_URL/$2"
}
s3 PUT "$BUCKET" >/dev/null
# warm RGW up (its first writes are slow) before anything is timed
head -c $((48 << 20)) /dev/urandom >"$W/warm"
"$VMSNAP" -q push "$W/warm" "s3://$BUCKET/warm" && "$VMSNAP" -q rm "s3://$BUCKET/warm"
rm -f "$W/warm"
store_bytes() { # PREFIX: bytes of every object under it
    local body
    body=$(s3 GET "$BUCKET/?list-type=2&max-keys=1000&prefix=$1%2F")
    echo "$body" | grep -o '<Size>[0-9]*</Size>' | sed 's/[^0-9]//g' | awk '{s+=$1} END {print s+0}'
}
con() { echo "$S/vms/$1/console.log"; }
lines() { wc -l <"$(con "$1")"; }
wait_line() { # NAME FROM REGEX
    local i
    for ((i = 0; i < 1200; i++)); do
        tail -n +"$(($2 + 1))" "$(con "$1")" | tr -d '\r' | grep -Eq "$3" && return 0
        sleep 0.1
    done
    echo "bench/layers.sh: $1 did not print '$3'" >&2
    return 1
}
vm() { "$VMSNAP" vm "$@" --state-dir "$S"; }
RES=$W/results.tsv
: >"$RES"
# timed MODE WHAT CMD...: run CMD (its --json on stdout into $W/j), record wall, client and
# server CPU and the JSON's bytes
timed() {
    local mode=$1 what=$2 s0 s1 cu cs
    shift 2
    s0=$(server_cpu)
    TIMEFORMAT='%U %S'
    { time "$@" >"$W/j"; } 2>"$W/cpu"
    s1=$(server_cpu)
    read -r cu cs <<<"$(tail -n1 "$W/cpu")"
    python3 -c 'import json,sys
d = json.load(open(sys.argv[1])); m, w = sys.argv[2], sys.argv[3]
print("%s\t%s.seconds\t%.3f" % (m, w, d["seconds"]))
print("%s\t%s.client-cpu\t%s" % (m, w, sys.argv[4]))
print("%s\t%s.server-cpu\t%s" % (m, w, sys.argv[5]))
ob = d.get("object_bytes", 0); cb = d.get("cached_bytes", 0)
if w.endswith("suspend"): print("%s\t%s.up-MiB\t%.2f" % (m, w, ob / 1048576))
else: print("%s\t%s.down-MiB\t%.2f" % (m, w, (ob - cb) / 1048576))' \
        "$W/j" "$mode" "$what" "$(echo "$cu + $cs" | bc)" "$(echo "$s1 - $s0" | bc)" >>"$RES"
}

for mode in $MODES; do
    echo "== $mode" >&2
    export VMSNAP_CACHE_DIR=$W/cache-$mode
    case $mode in
    layers) export VMSNAP_LAYOUT=layered opts=() ;;
    full-base) export VMSNAP_LAYOUT=reference opts=() ;;
    full-nobase) export VMSNAP_LAYOUT=reference opts=(--no-base) ;;
    esac
    vm run b --kernel "$G/vmlinux" --initrd "$G/initrd.cpio.gz" --mem 512M \
        --append "$(cat "$G/cmdline") vmsnap.dirty=64" 2>/dev/null
    wait_line b 0 'vmsnap-counter ram=1 '
    timed "$mode" golden-suspend vm suspend b "s3://$BUCKET/$mode/c0" --json
    if [ "$mode" = layers ]; then # "another node" resumes the golden first: its cache holds it
        VMSNAP_CACHE_DIR=$W/cache-nodeb vm resume nb0 "s3://$BUCKET/$mode/c0" >/dev/null
        vm stop --rm nb0 >/dev/null 2>&1 || true
    fi
    for ((c = 1; c <= CYCLES; c++)); do
        timed "$mode" resume vm resume b "s3://$BUCKET/$mode/c$((c - 1))" --json
        from=$(lines b)
        "$VMSNAP" vm console b --send "dirty $DIRTY" --state-dir "$S"
        wait_line b "$from" 'vmsnap-dirtied'
        timed "$mode" suspend vm suspend b "s3://$BUCKET/$mode/c$c" --json "${opts[@]}"
        if [ "$mode" = layers ]; then
            # the same set resumed on "another node": its own cache, which holds the parent
            # chain (it resumed every earlier set), so it fetches the new delta only
            VMSNAP_CACHE_DIR=$W/cache-nodeb timed "$mode" resume-b vm resume "nb$c" "s3://$BUCKET/$mode/c$c" --json
            vm stop --rm "nb$c" >/dev/null 2>&1 || true
        fi
    done
    vm stop --rm b >/dev/null 2>&1 || true
    printf '%s\tstore-MiB\t%.1f\n' "$mode" "$(echo "scale=1; $(store_bytes "$mode") / 1048576" | bc)" >>"$RES"
done

# 8 resumes of one golden on one node, the cache empty at the start: bytes fetched in all
if [[ " $MODES " == *" layers "* ]]; then
    export VMSNAP_LAYOUT=layered VMSNAP_CACHE_DIR=$W/cache-eight
    fetched=0
    for n in 1 2 3 4 5 6 7 8; do
        vm resume "g$n" "s3://$BUCKET/layers/c0" --json >"$W/j8"
        fetched=$((fetched + $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["object_bytes"] - d.get("cached_bytes", 0))' "$W/j8")))
        vm stop --rm "g$n" >/dev/null 2>&1 || true
    done
    golden=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["object_bytes"])' "$W/j8")
    printf 'eight\tfetched-MiB\t%.1f\neight\tgolden-MiB\t%.1f\n' \
        "$(echo "scale=1; $fetched / 1048576" | bc)" "$(echo "scale=1; $golden / 1048576" | bc)" >>"$RES"
    # resume time against depth (empty cache each time)
    for ((c = 0; c <= CYCLES; c++)); do
        depth=$(s3 GET "$BUCKET/layers/c$c/manifest.json" |
            python3 -c 'import json,sys; print(len(json.load(sys.stdin)["files"]["memory-ranges"]["layers"]))')
        export VMSNAP_CACHE_DIR=$W/cache-depth-$c
        vm resume "d$c" "s3://$BUCKET/layers/c$c" --json >"$W/jd"
        printf 'depth\t%s\t%s\n' "$depth" "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["seconds"])' "$W/jd")" >>"$RES"
        vm stop --rm "d$c" >/dev/null 2>&1 || true
    done
fi

cp "$RES" "${RESULTS_TSV:-/dev/null}" 2>/dev/null || true
python3 - "$RES" "$DIRTY" <<'EOF'
import sys, collections, statistics
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
dirty = float(sys.argv[2])
by = collections.defaultdict(list)
for m, k, v in rows:
    by[(m, k)].append(float(v))
def pct(v, p):
    v = sorted(v); return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]
modes = [m for m in ["layers", "full-base", "full-nobase"] if (m, "suspend.seconds") in by]
print("| per cycle | " + " | ".join(modes) + " |")
print("|---|" + "---|" * len(modes))
for k, lab in [("suspend.up-MiB", "uploaded MiB (p50)"), ("resume.down-MiB", "downloaded MiB (p50)"),
               ("suspend.seconds", "suspend s p50"), ("suspend.seconds@90", "suspend s p90"),
               ("resume.seconds", "resume s p50"), ("resume.seconds@90", "resume s p90"),
               ("resume-b.down-MiB", "other node (parent cached): downloaded MiB (p50)"),
               ("resume-b.seconds", "other node (parent cached): resume s p50"),
               ("resume-b.seconds@90", "other node (parent cached): resume s p90"),
               ("suspend.client-cpu", "suspend client CPU s (p50)"),
               ("suspend.server-cpu", "suspend server CPU s (p50)"),
               ("resume.client-cpu", "resume client CPU s (p50)"),
               ("resume.server-cpu", "resume server CPU s (p50)")]:
    key, p = (k.split("@")[0], int(k.split("@")[1])) if "@" in k else (k, 50)
    print("| %s | %s |" % (lab, " | ".join("%.2f" % pct(by[(m, key)], p) if (m, key) in by else "-" for m in modes)))
print("| store MiB after the cycles (golden included) | %s |" %
      " | ".join("%.1f" % by[(m, "store-MiB")][0] for m in modes))
print("| golden suspend MiB | %s |" % " | ".join("%.1f" % by[(m, "golden-suspend.up-MiB")][0] for m in modes))
print("| golden suspend s | %s |" % " | ".join("%.2f" % by[(m, "golden-suspend.seconds")][0] for m in modes))
if ("layers", "suspend.up-MiB") in by and ("full-nobase", "suspend.seconds") in by:
    l, f = by[("layers", "suspend.seconds")], by[("full-nobase", "suspend.seconds")]
    print("\nlayers/full-nobase: suspend p50 %.2fx, resume p50 %.2fx (on another node, the parent cached: %.2fx); upload p50 %.2fx the %d MiB dirtied" %
          (pct(l, 50) / pct(f, 50), pct(by[("layers", "resume.seconds")], 50) / pct(by[("full-nobase", "resume.seconds")], 50),
           pct(by[("layers", "resume-b.seconds")], 50) / pct(by[("full-nobase", "resume.seconds")], 50),
           pct(by[("layers", "suspend.up-MiB")], 50) / dirty, dirty))
if ("eight", "fetched-MiB") in by:
    print("\n8 resumes of one golden, one node, cache empty at the start: %.1f MiB fetched (golden %.1f MiB)" %
          (by[("eight", "fetched-MiB")][0], by[("eight", "golden-MiB")][0]))
d = sorted((int(k), v[0]) for (m, k), v in by.items() if m == "depth")
if d:
    print("\n| chain depth | resume s (cache empty) |\n|---|---|")
    for k, v in d:
        print("| %d | %.2f |" % (k, v))
EOF
