#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Page-cache hygiene benchmark: the reference system's memory-constrained scenario.
#
# A memory cgroup limited to 768 MiB (cgroup v1 memory.limit_in_bytes, or v2 memory.max) holds a
# "guest" process with 512 MiB of anonymous memory that dirties 64 MiB before each cycle. A cycle:
#   pause   the guest writes its RAM as a 512 MiB image into a checkpoint directory, not fsynced
#           (what a VMM snapshot does); then the image is packed (vmsnap pack, untimed)
#   resume  the previous checkpoint's packed image is unpacked into a restore directory, the guest
#           loads it into its RAM, and the restore directory is released
# Modes: off (no hygiene), on (staged release of the restore directory; preserve eviction of the
# checkpoint files with background retries), kick (on + --kick-writeback), vmtouch (`vmtouch -e`
# on the same files, the peer tool). Reports pause/resume p50/p90/p99/max, the cgroup's peak
# usage, and the checkpoint/restore files' cached pages 5 s after the last resume. Then: CPU cost
# of evicting a 2 GiB file, and kick-writeback vs background retries on a fresh 512 MiB file.
#
# usage: bench/pcache.sh VMSNAP_BIN [CYCLES (default 30)] [MODES (default "off on kick vmtouch")]
# DISK_WRITE_MBPS=N emulates a slower (cloud) disk for the run: a cgroup v1 root blkio throttle
# on the work directory's device, which also limits the kernel's writeback; removed at exit.
# PAUSE_MODE=delta makes a pause write only the pages dirtied since the last one into a sparse
# image (what Cloud Hypervisor writes after an on-demand restore) instead of the whole RAM.
# EXTRAS=0 skips the eviction-cost and fresh-file measurements after the cycles.
# Needs root, a memory cgroup, python3, vmtouch; work files go under $BENCH_DIR (default /var/tmp).
set -euo pipefail
VMSNAP=$(realpath "${1:?usage: bench/pcache.sh VMSNAP_BIN [CYCLES] [MODES]}")
CYCLES=${2:-30}
MODES=${3:-off on kick vmtouch}
BASE=${BENCH_DIR:-/var/tmp}/vmsnap-pcache-bench.$$
LIMIT=$((768 << 20))
GUEST_MIB=512
DIRTY_MIB=64

[ "$(id -u)" = 0 ] || { echo "pcache bench: needs root (cgroups)" >&2; exit 1; }
command -v vmtouch >/dev/null || { echo "pcache bench: vmtouch missing (scripts/deps.sh bench)" >&2; exit 1; }

if [ -d /sys/fs/cgroup/memory ]; then
    CGV=1
    CGROOT=/sys/fs/cgroup/memory
elif grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
    CGV=2
    CGROOT=/sys/fs/cgroup
    # children get the memory (and io, for cgroup writeback) controllers only when enabled here
    for c in memory io; do
        grep -qw $c "$CGROOT/cgroup.subtree_control" || echo "+$c" >"$CGROOT/cgroup.subtree_control" ||
            { echo "pcache bench: cannot enable the $c controller in $CGROOT" >&2; exit 1; }
    done
else
    echo "pcache bench: no memory cgroup controller" >&2
    exit 1
fi
CG=""
THROTTLE=""
cleanup() {
    [ -n "$THROTTLE" ] && echo "$THROTTLE 0" >/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device
    [ -n "${GUEST_PID:-}" ] && kill "$GUEST_PID" 2>/dev/null && wait "$GUEST_PID" 2>/dev/null
    echo $$ >"$CGROOT/cgroup.procs" 2>/dev/null || true
    [ -n "$CG" ] && rmdir "$CG" 2>/dev/null
    rm -rf "$BASE"
}
trap cleanup EXIT
mkdir -p "$BASE"
if [ -n "${DISK_WRITE_MBPS:-}" ]; then
    dev=$(stat -c %d "$BASE")
    THROTTLE="$((dev >> 8)):$((dev & 255))"
    echo "$THROTTLE $((DISK_WRITE_MBPS * 1000000))" >/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device ||
        { echo "pcache bench: cannot throttle $THROTTLE" >&2; THROTTLE=""; exit 1; }
    echo "disk writes throttled to $DISK_WRITE_MBPS MB/s on $THROTTLE" >&2
fi

cg_create() {
    CG=$CGROOT/vmsnap-pcache-bench.$$.$1
    mkdir "$CG"
    if [ "$CGV" = 1 ]; then
        echo "$LIMIT" >"$CG/memory.limit_in_bytes"
    else
        echo "$LIMIT" >"$CG/memory.max"
    fi
    echo $$ >"$CG/cgroup.procs"
}
cg_peak() {
    if [ "$CGV" = 1 ]; then cat "$CG/memory.max_usage_in_bytes"; else cat "$CG/memory.peak"; fi
}
cg_leave() {
    echo $$ >"$CGROOT/cgroup.procs"
    rmdir "$CG"
    CG=""
}

# The guest: a python3 process holding GUEST_MIB of RAM (half random, half zero per page, so it
# compresses about 2:1 like real guest memory), answering one command per line.
cat >"$BASE/guest.py" <<'EOF'
import os, sys, time
MIB = 1 << 20
size = int(sys.argv[1]) * MIB
dirty = int(sys.argv[2]) * MIB
delta = len(sys.argv) > 3 and sys.argv[3] == "delta"
last = 0
ram = bytearray(size)
view = memoryview(ram)
pool = os.urandom(dirty // 2 + 2048)
def fill(off, length, seed):
    # each 4 KiB page: 2 KiB from the random pool (rotated by seed), 2 KiB zeros
    for p in range(off, off + length, 4096):
        s = ((p // 4096) * 2048 + seed * 8192) % (len(pool) - 2048)
        view[p:p + 2048] = pool[s:s + 2048]
        view[p + 2048:p + 4096] = bytes(2048)
fill(0, size, 0)
cycle = 0
print("ready", flush=True)
for line in sys.stdin:
    cmd, _, arg = line.strip().partition(" ")
    t0 = time.monotonic()
    if cmd == "dirty":
        cycle += 1
        off = (cycle * dirty) % size
        fill(off, dirty, cycle)
        last = off
    elif cmd == "pause":
        with open(arg, "wb") as f:
            if delta:
                f.truncate(size)
                f.seek(last)
                f.write(view[last:last + dirty])
            else:
                for o in range(0, size, 8 * MIB):
                    f.write(view[o:o + 8 * MIB])
    elif cmd == "load":
        with open(arg, "rb") as f:
            o = 0
            while o < size:
                n = f.readinto(view[o:o + 8 * MIB])
                if not n:
                    break
                o += n
    print("%.6f" % (time.monotonic() - t0), flush=True)
EOF

# The stats helper: percentiles over a file of numbers.
pct() {
    python3 - "$1" <<'EOF'
import sys
v = sorted(float(x) for x in open(sys.argv[1]) if x.strip())
def p(q):
    if not v: return float("nan")
    i = min(len(v) - 1, max(0, int(round(q / 100.0 * len(v) + 0.5)) - 1))
    return v[i]
print("%d %.0f %.0f %.0f %.0f %.0f" % (len(v), p(50) * 1000, p(90) * 1000, p(99) * 1000, v[-1] * 1000,
                                 sum(v) / len(v) * 1000))
EOF
}

now() { echo "$EPOCHREALTIME"; }
elapsed() { python3 -c "print('%.6f' % ($2 - $1))"; }

guest_cmd() {
    echo "$1" >&"${GUEST[1]}"
    local reply
    read -r reply <&"${GUEST[0]}"
    echo "$reply"
}

# Cached fraction (percent) of all files under the given paths.
cached_pct() {
    "$VMSNAP" cache stat --json "$@" 2>/dev/null |
        python3 -c 'import json,sys; t=json.load(sys.stdin)["total"]; print("%.2f" % (100.0*t["cached"]/t["pages"] if t["pages"] else 0))'
}

if "$VMSNAP" help pack >/dev/null 2>&1; then HAVE_PACK=1; else HAVE_PACK=0; fi

run_mode() {
    local mode=$1 W=$BASE/$1
    mkdir -p "$W/ckpt" "$W/restore"
    sync
    echo 3 >/proc/sys/vm/drop_caches
    cg_create "$mode"
    coproc GUEST { exec python3 -u "$BASE/guest.py" "$GUEST_MIB" "$DIRTY_MIB" "${PAUSE_MODE:-full}"; }
    GUEST_PID=$GUEST_PID
    local ready
    read -r ready <&"${GUEST[0]}"
    [ "$ready" = ready ] || { echo "guest failed to start" >&2; exit 1; }
    : >"$W/pause.txt"
    : >"$W/resume.txt"
    : >"$W/pack.txt"
    local keep=""
    [ "$mode" = off ] && keep=--keep-cache
    local i prev t0 t1
    local evictors=()
    for ((i = 0; i <= CYCLES; i++)); do
        guest_cmd dirty >/dev/null
        # pause: the guest writes its RAM image (timed by the guest around open/write/close)
        local p
        p=$(guest_cmd "pause $W/ckpt/mem-$i.img")
        [ "$i" -gt 0 ] && echo "$p" >>"$W/pause.txt"
        t0=$(now)
        if [ "$HAVE_PACK" = 1 ]; then
            "$VMSNAP" -q pack -j 2 --frame-size 8M $keep "$W/ckpt/mem-$i.img" "$W/ckpt/mem-$i.vms"
        else
            cp "$W/ckpt/mem-$i.img" "$W/ckpt/mem-$i.vms"
        fi
        t1=$(now)
        elapsed "$t0" "$t1" >>"$W/pack.txt"
        case $mode in
        on | kick)
            # the restore flow's background retrier, as a background process
            "$VMSNAP" -q cache evict $([ "$mode" = kick ] && echo --kick-writeback) --wait 5 \
                "$W/ckpt/mem-$i.img" "$W/ckpt/mem-$i.vms" &
            evictors+=($!)
            ;;
        vmtouch) vmtouch -q -e "$W/ckpt/mem-$i.img" "$W/ckpt/mem-$i.vms" ;;
        esac
        if [ "$i" -gt 0 ]; then
            prev=$((i - 1))
            # resume: unpack the previous checkpoint, the guest loads it, release
            t0=$(now)
            mkdir -p "$W/restore"
            if [ "$HAVE_PACK" = 1 ]; then
                "$VMSNAP" -q unpack -j 2 "$W/ckpt/mem-$prev.vms" "$W/restore/mem.img"
            else
                cp "$W/ckpt/mem-$prev.vms" "$W/restore/mem.img"
            fi
            guest_cmd "load $W/restore/mem.img" >/dev/null
            case $mode in
            on | kick) "$VMSNAP" -q cache evict --staged "$W/restore" ;;
            vmtouch) vmtouch -q -e "$W/restore/mem.img" ;;
            esac
            t1=$(now)
            elapsed "$t0" "$t1" >>"$W/resume.txt"
            rm -f "$W/ckpt/mem-$((i - 2)).img" "$W/ckpt/mem-$((i - 2)).vms"
        fi
    done
    for pid in "${evictors[@]}"; do wait "$pid" || true; done
    sleep 5
    local cached
    cached=$(cached_pct "$W/ckpt" "$W/restore")
    local peak
    peak=$(cg_peak)
    local failcnt=0
    [ "$CGV" = 1 ] && failcnt=$(cat "$CG/memory.failcnt")
    kill "$GUEST_PID" 2>/dev/null || true
    wait "$GUEST_PID" 2>/dev/null || true
    GUEST_PID=""
    cg_leave
    read -r n p50 p90 p99 max avg < <(pct "$W/pause.txt")
    read -r rn r50 r90 r99 rmax ravg < <(pct "$W/resume.txt")
    read -r _ k50 _ _ _ _ < <(pct "$W/pack.txt")
    printf "| %-7s | %3d | %5d | %5d | %5d | %5d | %5d | %5d | %5d | %5d | %5d | %5d | %4d | %6.1f | %5s | %s |\n" \
        "$mode" "$n" "$p50" "$p90" "$p99" "$max" "$avg" "$r50" "$r90" "$r99" "$rmax" "$ravg" "$k50" \
        "$(echo "$peak" | awk '{print $1/1048576}')" "$cached" "$failcnt" | tee -a "$BASE/table.txt"
    cp "$W/pause.txt" "$BASE/raw-pause-$mode.txt"
    cp "$W/resume.txt" "$BASE/raw-resume-$mode.txt"
    rm -rf "$W"
}

echo "# vmsnap page-cache hygiene bench: $(date -u +%Y-%m-%dT%H:%MZ), $(uname -r), $(nproc) CPUs," \
    "$(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), cgroup v$CGV limit 768 MiB," \
    "guest ${GUEST_MIB} MiB dirtying ${DIRTY_MIB} MiB/cycle, $CYCLES cycles, resume via $([ "$HAVE_PACK" = 1 ] && echo "vmsnap unpack" || echo "cp")"
echo
echo "| mode    |   n | pause p50 ms | p90 | p99 | max | avg | resume p50 ms | p90 | p99 | max | avg | pack p50 ms | peak MiB | cached % 5 s after | failcnt |"
echo "|---------|-----|-----|-----|-----|-----|-----|-----|-----|-----|-----|-----|-----|--------|-------|---|"
for m in $MODES; do
    run_mode "$m"
done

# CPU cost of evicting a 2 GiB clean, fully cached file: vmsnap vs vmtouch -e, with the pages
# cached two ways (read back, which makes large folios; written then synced, 4 KiB folios).
# cpu_of CMD...: the command's user+system CPU in ms (bash's `time`, from the children's rusage
# at microsecond resolution; process start-up included, about 2-3 ms for vmsnap).
cpu_of() {
    local TIMEFORMAT='%3U %3S'
    { time "$@" >/dev/null 2>&1; } 2>"$BASE/cpu"
    awk '{printf "%.1f", ($1 + $2) * 1000}' "$BASE/cpu"
}
[ "${EXTRAS:-1}" = 0 ] && exit 0
echo
F=$BASE/big.img
for how in read written; do
    for tool in vmsnap vmtouch; do
        if [ "$how" = written ] || [ ! -e "$F" ]; then
            rm -f "$F"
            head -c 2G /dev/urandom >"$F"
            sync "$F"
        fi
        [ "$how" = read ] && { vmtouch -q -e "$F"; cat "$F" | cat >/dev/null; }
        before=$(cached_pct "$F")
        if [ "$tool" = vmsnap ]; then
            ms=$(cpu_of "$VMSNAP" -q cache evict "$F")
        else
            ms=$(cpu_of vmtouch -q -e "$F")
        fi
        echo "evict 2 GiB, pages $how ($tool): cached ${before}% -> $(cached_pct "$F")%, CPU ${ms} ms (process total)"
    done
done
rm -f "$F"

# A freshly written 512 MiB file: background retries alone vs kick-writeback + retries
# (outside the cgroup, machine otherwise idle): how long until its pages are gone.
echo
for variant in retries kick; do
    F=$BASE/fresh-$variant.img
    head -c 512M /dev/urandom >"$F"
    flag=""
    [ "$variant" = kick ] && flag=--kick-writeback
    t0=$(now)
    /usr/bin/time -f "%e %U %S" -o "$BASE/time" "$VMSNAP" cache evict $flag --wait 3 "$F" >"$BASE/out"
    t1=$(now)
    read -r wall usr sys <"$BASE/time"
    # poll for up to 35 s until under 1% cached
    gone=""
    for ((k = 0; k < 350; k++)); do
        c=$(cached_pct "$F")
        if awk "BEGIN {exit !($c < 1)}"; then gone=$(elapsed "$t0" "$(now)"); break; fi
        sleep 0.1
    done
    echo "fresh 512 MiB ($variant): evict --wait 3 took ${wall}s (CPU ${usr}+${sys}s): $(tr '\n' ';' <"$BASE/out") cached now $(cached_pct "$F")%, under 1% after ${gone:->35}s"
    rm -f "$F"
done
