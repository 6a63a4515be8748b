#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# VM lifecycle benchmark: the counter guest (512 MiB, a 64 MiB random blob at boot) dirties
# 64 MiB more before every checkpoint; N cycles (default 20) of
#   pause/resume            (local checkpoint)
#   suspend/resume local    (local directory store)
#   suspend/resume rgw      (a throw-away Ceph RGW started here, if Ceph is installed; each suspend
#                            has the previous set as its base: unchanged frames copied by RGW)
#   suspend/resume rgw-nobase  (the same with --no-base: every frame compressed and uploaded)
# each in a 768 MiB memory cgroup (cgroup v1 or v2) and without a limit, with and without
# page-cache hygiene (--no-evict). Prints p50/p90/p99 of every step and end to end as a
# markdown table, plus the page cache the checkpoint keeps after resume and QEMU's RSS.
#
#   bench/vm.sh [BUILD_DIR]     env: CYCLES=20 OPS="pause local rgw rgw-nobase" LIMITS="768M none"
#                                    HYGIENE="on off" BENCH_DIR=/var/tmp BLOB_MIB=64 (boot blob)
# Runs under TCG here (no vmx/svm): the figures are for ratios, not absolute claims.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$here/build}
. "$here/bench/lib.sh" # server_cpu
VMSNAP=$BUILD/vmsnap
CYCLES=${CYCLES:-20}
OPS=${OPS:-pause local rgw rgw-nobase}
LIMITS=${LIMITS:-768M none}
HYGIENE=${HYGIENE:-on off}
[ -x "$VMSNAP" ] || { echo "bench/vm.sh: build first ($VMSNAP missing)" >&2; exit 1; }
G=$(bash "$here/guest/build.sh")
W=$(mktemp -d "${BENCH_DIR:-/var/tmp}/vmsnap-vmbench.XXXXXX")
S=$W/state
CG=
RGW=
cleanup() {
    "$VMSNAP" vm stop --rm --state-dir "$S" b >/dev/null 2>&1 || true
    [ -n "$RGW" ] && bash "$here/tests/rgw-down.sh" "$RGW" >/dev/null 2>&1 || true
    [ -n "$CG" ] && rmdir "$CG" 2>/dev/null || true
    rm -rf "$W"
}
trap cleanup EXIT

# ---- memory cgroup ----
cg_make() { # cg_make LIMIT: a fresh cgroup with that memory limit; sets CG
    if [ -d /sys/fs/cgroup/memory ]; then
        CG=/sys/fs/cgroup/memory/vmsnap-vmbench-$$
        mkdir -p "$CG"
        echo "$1" >"$CG/memory.limit_in_bytes"
    else
        CG=/sys/fs/cgroup/vmsnap-vmbench-$$
        mkdir -p "$CG"
        echo "$1" >"$CG/memory.max"
    fi
}
cg_drop() {
    [ -n "$CG" ] || return 0
    local p
    for p in $(cat "$CG/cgroup.procs" 2>/dev/null); do
        echo "$p" >"$(dirname "$CG")/cgroup.procs" 2>/dev/null || true
    done
    rmdir "$CG" 2>/dev/null || true
    CG=
}
# run CMD... inside the cgroup (when one is set); QEMU started by vmsnap inherits it
in_cg() {
    if [ -n "$CG" ]; then
        (echo "$BASHPID" >"$CG/cgroup.procs" && exec "$@")
    else
        "$@"
    fi
}

# ---- guest helpers ----
con() { echo "$S/vms/b/console.log"; }
lines() { wc -l <"$(con)"; }
wait_line() { # wait_line FROM REGEX
    local i
    for ((i = 0; i < 600; i++)); do
        tail -n +"$(($1 + 1))" "$(con)" | tr -d '\r' | grep -Eq "$2" && return 0
        sleep 0.1
    done
    echo "bench/vm.sh: guest did not print '$2'" >&2
    return 1
}
vm() { in_cg "$VMSNAP" vm "$@" --state-dir "$S"; }

# ---- RGW ----
if [[ " $OPS " == *" rgw"* ]]; then
    if command -v radosgw >/dev/null; then
        RGW=$W/rgw
        bash "$here/tests/rgw-up.sh" "$RGW" >"$W/rgw.log" 2>&1 || { echo "RGW did not start" >&2; RGW=; }
    fi
    if [ -n "$RGW" ]; then
        # shellcheck disable=SC1091
        . "$RGW/env"
        BUCKET=vmbench-$$
        code=$(curl -sS -o /dev/null -w '%{http_code}' --aws-sigv4 "aws:amz:us-east-1:s3" \
            --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
            -H "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" \
            -X PUT "$AWS_ENDPOINT_URL/$BUCKET")
        [ "$code" = 200 ] || { echo "bench/vm.sh: cannot create bucket $BUCKET (HTTP $code)" >&2; exit 1; }
        # Warm up: a fresh RGW creates its data pools on the first object write (seconds), which
        # a real store did long ago; one throw-away multipart push keeps that out of the rows.
        head -c $((48 << 20)) /dev/urandom >"$W/warm"
        "$VMSNAP" -q push "$W/warm" "s3://$BUCKET/warm" && "$VMSNAP" -q rm "s3://$BUCKET/warm" ||
            echo "bench/vm.sh: RGW warm-up push failed" >&2
        rm -f "$W/warm"
    else
        echo "bench/vm.sh: no RGW (scripts/deps.sh s3); skipping the rgw rows" >&2
        OPS=${OPS//rgw-nobase/}
        OPS=${OPS//rgw/}
    fi
fi

RES=$W/results.tsv
: >"$RES"
record() { # record CONFIG JSON-LINE
    python3 -c 'import json,sys
d=json.loads(sys.argv[2]); op=d["op"]
for k,v in d["steps"].items(): print("%s\t%s.%s\t%s" % (sys.argv[1], op, k, v))
print("%s\t%s.total\t%s" % (sys.argv[1], op, d["seconds"]))
if "object_bytes" in d:
    print("%s\t%s.object-MiB\t%.1f" % (sys.argv[1], op, d["object_bytes"] / 1048576))
    print("%s\t%s.copied-by-store-MiB\t%.1f" % (sys.argv[1], op, d["copied_bytes"] / 1048576))' "$1" "$2" >>"$RES"
}

for limit in $LIMITS; do
    for hyg in $HYGIENE; do
        for op in $OPS; do
            cfg="$op limit=$limit hygiene=$hyg"
            echo "== $cfg" >&2
            "$VMSNAP" vm stop --rm --state-dir "$S" b >/dev/null 2>&1 || true
            [ "$limit" = none ] || cg_make "$limit"
            ne=()
            [ "$hyg" = off ] && ne=(--no-evict)
            nb=()
            [ "$op" = rgw-nobase ] && nb=(--no-base)
            vm run b --kernel "$G/vmlinux" --initrd "$G/initrd.cpio.gz" --mem 512M \
                --append "$(cat "$G/cmdline") vmsnap.dirty=${BLOB_MIB:-64}" 2>/dev/null
            wait_line 0 'vmsnap-counter ram=1 '
            case $op in
            pause) url= ;;
            local) url=$W/store/set ;;
            rgw | rgw-nobase) url=s3://$BUCKET/set-$op ;;
            esac
            for ((c = 1; c <= CYCLES; c++)); do
                from=$(lines)
                "$VMSNAP" vm console b --send "dirty 64" --state-dir "$S"
                wait_line "$from" 'vmsnap-dirtied'
                t0=$(date +%s.%N)
                if [ -z "$url" ]; then
                    j1=$(vm pause b --json "${ne[@]}")
                    j2=$(vm resume b --json "${ne[@]}")
                elif [ "$op" != local ]; then
                    # CPU seconds of the client (this suspend) and of the co-located server
                    s0=$(server_cpu)
                    TIMEFORMAT='%U %S'
                    { time j1=$(vm suspend b "$url" --json "${ne[@]}" "${nb[@]}"); } 2>"$W/cpu"
                    s1=$(server_cpu)
                    read -r cu cs <"$W/cpu"
                    printf '%s\tsuspend.client-cpu-s\t%s\n' "$cfg" "$(echo "$cu + $cs" | bc)" >>"$RES"
                    printf '%s\tsuspend.server-cpu-s\t%s\n' "$cfg" "$(echo "$s1 - $s0" | bc)" >>"$RES"
                    j2=$(vm resume b "$url" --json "${ne[@]}")
                else
                    j1=$(vm suspend b "$url" --json "${ne[@]}")
                    j2=$(vm resume b "$url" --json "${ne[@]}")
                fi
                t1=$(date +%s.%N)
                record "$cfg" "$j1"
                record "$cfg" "$j2"
                printf '%s\tend-to-end\t%s\n' "$cfg" "$(echo "$t1 - $t0" | bc)" >>"$RES"
                from2=$(lines)
                wait_line "$from2" 'vmsnap-counter ram='
                # what stays in memory after resume: page cache of the checkpoint, QEMU's RSS
                if [ -d "$S/vms/b/checkpoint" ]; then
                    cached=$("$VMSNAP" cache stat --json "$S/vms/b/checkpoint" |
                        python3 -c 'import json,sys; d=json.load(sys.stdin); t=d.get("total",d); print(t["cached"]*t.get("page_size",4096)/1048576)')
                    printf '%s\tcheckpoint-cached-MiB\t%s\n' "$cfg" "$cached" >>"$RES"
                fi
                pid=$(cat "$S/vms/b/pid")
                rss=$(awk '/^VmRSS/{print $2/1024}' "/proc/$pid/status")
                printf '%s\tqemu-rss-MiB\t%s\n' "$cfg" "$rss" >>"$RES"
                ram=$(sed -n 's/.*"ram_path": "\(.*\)".*/\1/p' "$S/vms/b/vm.json")
                printf '%s\tram-file-allocated-MiB\t%s\n' "$cfg" \
                    "$(($(stat -c %b "$ram") * 512 / 1048576))" >>"$RES"
            done
            "$VMSNAP" vm stop --rm --state-dir "$S" b >/dev/null
            cg_drop
        done
    done
done

echo
echo "# VM lifecycle benchmark ($(date -u +%F), accel: $("$VMSNAP" vm ls --state-dir "$S" >/dev/null; grep -Eq 'vmx|svm' /proc/cpuinfo && echo kvm || echo tcg))"
echo "Machine: $(nproc) CPUs, $(free -g | awk '/Mem:/{print $2}') GiB RAM, kernel $(uname -r);" \
    "guest 512 MiB, 64 MiB blob + 64 MiB dirtied per cycle, $CYCLES cycles per row."
python3 - "$RES" <<'PY'
import sys, collections
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    cfg, key, val = line.rstrip("\n").split("\t")
    rows.setdefault(cfg, collections.OrderedDict()).setdefault(key, []).append(float(val))
def pct(v, p):
    v = sorted(v)
    k = (len(v) - 1) * p / 100
    f = int(k)
    c = min(f + 1, len(v) - 1)
    return v[f] + (v[c] - v[f]) * (k - f)
for cfg, keys in rows.items():
    print(f"\n## {cfg}\n")
    print("| step | p50 | p90 | p99 | n |")
    print("|---|---:|---:|---:|---:|")
    for k, v in keys.items():
        unit = "" if k.endswith("MiB") else " s"
        fmt = "{:.1f}" if k.endswith("MiB") else "{:.3f}"
        print(f"| {k} | " + " | ".join(fmt.format(pct(v, p)) + unit for p in (50, 90, 99)) + f" | {len(v)} |")
PY
