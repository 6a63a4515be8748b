#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Upper-disk benchmark, vmsnap side by side with the peer tools in one run (issue 5):
#  1. seeded image (resolv.conf, hosts, hostname) at 4, 16, 64 GiB: vmsnap disk create vs
#     mke2fs -t ext4 -O ^has_journal -d DIR (wall, CPU, allocated bytes);
#  2. 20,000 small files from a directory: vmsnap --from-dir vs mke2fs -d;
#  3. clone of a seeded 4 GiB image holding 100 MiB: vmsnap clone vs cp --sparse=always vs a
#     plain whole-file copy_file_range vs cp --reflink=never, and FICLONE on a loop XFS;
#  4. golden clone + new UUID vs a fresh create.
# Each row: median wall time of N runs (each a fresh process exec'd directly, as a worker spawns
# it: no shell in between; output files removed between runs, outside the timing) and mean CPU
# (user+sys) per run. Prints a Markdown table, then the process floor of this machine (a static
# empty program) and the best whole-process ratio against mke2fs that floor allows.
#   bench/disk.sh [path/to/vmsnap]    (root needed for the XFS part; skipped otherwise)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
VMSNAP=$(realpath "${1:-$here/build/vmsnap}")
for t in mke2fs bc python3; do command -v $t >/dev/null || { echo "need $t"; exit 1; }; done
W=$(mktemp -d "${BENCH_DIR:-/var/tmp}/vmsnap-disk-bench.XXXXXX")
XFS=$W/xfs
trap 'mountpoint -q "$XFS" && umount "$XFS"; rm -rf "$W"' EXIT
cd "$W"

# loop_time N CMD: run CMD (split like a shell word list, exec'd directly) N times; sets MS and
# CPUMS to the median wall and the mean CPU (user+sys of the children) per run, in ms. Files
# named by OUT (space separated) are removed before each run, outside the timing.
cat >timer.py <<'PYEOF'
import os, resource, shlex, statistics, subprocess, sys, time
n, cmd, outs = int(sys.argv[1]), sys.argv[2], sys.argv[3].split()
walls = []
r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
for _ in range(n):
    for o in outs:
        if os.path.exists(o):
            os.unlink(o)
    t = time.perf_counter()
    p = subprocess.run(shlex.split(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    walls.append(time.perf_counter() - t)
    if p.returncode:
        sys.exit("failed: %s: %s" % (cmd, p.stderr.decode()[-300:]))
r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) / n
print("%.2f %.2f" % (statistics.median(walls) * 1000, cpu * 1000))
PYEOF
OUT=""
loop_time() {
    read -r MS CPUMS < <(python3 timer.py "$1" "$2" "$OUT")
}
alloc() { echo $(($(stat -c %b "$1") * 512)); }
kib() { echo "scale=0; $1 / 1024" | bc; }
ratio() { echo "scale=1; $1 / $2" | bc; }
rows=()
row() { rows+=("| $1 | $2 | $3 | $4 | $5 |"); }

mkdir seed
echo "nameserver 10.0.0.1" >seed/resolv.conf
printf '127.0.0.1 localhost\n10.0.0.2 vm\n' >seed/hosts
echo vm >seed/hostname
mkdir -p seedtree/etc && cp seed/* seedtree/etc/
ADDS="--add seed/resolv.conf:/etc/resolv.conf --add seed/hosts:/etc/hosts --add seed/hostname:/etc/hostname"

# The vmsnap CLI maps only libc (its other libraries are linked from their archives; libcurl
# and libcrypto are dlopened by the S3 code only). A disk-only program on the same library code,
# linked fully statically (no dynamic loader at all), shows what the disk code costs as a whole
# process with nothing else in the way.
DISK_BINS=() # "path|label" of the disk-only binaries that built
if [ -f "$(dirname "$VMSNAP")/libvmsnap_static.a" ] && command -v cc >/dev/null; then
    cat >diskonly.c <<'CEOF'
#include "vmsnap/disk.h"
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv)
{
    struct vmsnap_err e = {0};
    int rc;
    if (argc >= 3 && !strcmp(argv[1], "create")) { /* create IMAGE [SRC:DEST]... (4 GiB) */
        struct vmsnap_disk_entry ents[8];
        int n = 0;
        for (int i = 3; i < argc && n < 8; i++, n++) {
            char *c = strchr(argv[i], ':');
            *c = '\0';
            ents[n] = (struct vmsnap_disk_entry){VMSNAP_DISK_ADD, argv[i], c + 1, -1, -1, -1};
        }
        struct vmsnap_disk_create_opts o = {.size = 4ull << 30, .entries = ents, .n_entries = (size_t)n};
        rc = vmsnap_disk_create(argv[2], &o, &e);
    } else if (argc == 4 && !strcmp(argv[1], "clone-new-uuid")) {
        struct vmsnap_disk_clone_opts o = {.new_uuid = 1};
        rc = vmsnap_disk_clone(argv[2], argv[3], &o, NULL, &e);
    } else {
        return 2;
    }
    if (rc < 0)
        fprintf(stderr, "%s\n", e.msg);
    return rc < 0;
}
CEOF
    # linked statically (no dynamic loader, no shared objects to map)
    if cc -O2 -static -I"$here/include" diskonly.c "$(dirname "$VMSNAP")/libvmsnap_static.a" \
        -lext2fs -lcom_err -lzstd -lxxhash -ljson-c -lpthread -o diskonly-static 2>/dev/null; then
        DISK_BINS+=("$W/diskonly-static|disk-only binary, static")
    fi
fi
# The floor: the cheapest process this machine can start (static, does nothing).
FLOOR=""
printf 'int main(void) { return 0; }\n' >floor.c
cc -O2 -static floor.c -o floor 2>/dev/null && FLOOR=$W/floor
SEEDARGS="seed/resolv.conf:/etc/resolv.conf seed/hosts:/etc/hosts seed/hostname:/etc/hostname"

# 1. seeded images
N=${N_CREATE:-21}
for size in 4G 16G 64G; do
    OUT="v.img m.img"
    loop_time $N "'$VMSNAP' disk create --size $size $ADDS v.img"
    v_ms=$MS
    row "create seeded $size: vmsnap" "$MS" "$CPUMS" "$(kib "$(alloc v.img)")" "1.0"
    e2fsck -fn v.img >/dev/null 2>&1 || { echo "vmsnap image not clean" >&2; exit 1; }
    loop_time $N "'$VMSNAP' disk create --fsync --size $size $ADDS v.img"
    row "create seeded $size: vmsnap --fsync" "$MS" "$CPUMS" "$(kib "$(alloc v.img)")" "$(ratio "$MS" "$v_ms")"
    loop_time $N "mke2fs -q -F -t ext4 -O ^has_journal -d seedtree m.img $size"
    row "create seeded $size: mke2fs -O ^has_journal -d" "$MS" "$CPUMS" "$(kib "$(alloc m.img)")" "$(ratio "$MS" "$v_ms")"
    [ $size = 4G ] || continue
    m4_ms=$MS
    for b in "${DISK_BINS[@]}"; do
        loop_time $N "${b%%|*} create v.img $SEEDARGS"
        row "create seeded 4G: ${b#*|}" "$MS" "$CPUMS" "$(kib "$(alloc v.img)")" "$(ratio "$MS" "$v_ms") (mke2fs/this: $(ratio "$m4_ms" "$MS"))"
        e2fsck -fn v.img >/dev/null 2>&1 || { echo "${b#*|}: image not clean" >&2; exit 1; }
    done
done

# 2. 20,000 small files (0-4 KiB), flat and spread over 100 directories
python3 - <<'PYEOF'
import os, random
r = random.Random(5)
for layout in ("flat", "spread"):
    os.mkdir(layout)
    for i in range(20000):
        d = layout if layout == "flat" else os.path.join(layout, "d%02d" % (i % 100))
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "f%05d" % i), "wb") as f:
            f.write(os.urandom(r.randint(0, 4096)))
PYEOF
for layout in flat spread; do
    loop_time 3 "'$VMSNAP' disk create --size 4G --from-dir $layout v.img"
    v_ms=$MS
    row "20,000 files ($layout): vmsnap --from-dir" "$MS" "$CPUMS" "$(kib "$(alloc v.img)")" "1.0"
    e2fsck -fn v.img >/dev/null 2>&1 || { echo "vmsnap from-dir image not clean" >&2; exit 1; }
    loop_time 3 "mke2fs -q -F -t ext4 -O ^has_journal -d $layout m.img 4G"
    row "20,000 files ($layout): mke2fs -d" "$MS" "$CPUMS" "$(kib "$(alloc m.img)")" "$(ratio "$MS" "$v_ms")"
done

# 3. clone a 4 GiB image holding 100 MiB
mkdir data && head -c $((100 << 20)) /dev/urandom >data/blob
"$VMSNAP" disk create --size 4G --from-dir data golden.img
G_ALLOC=$(alloc golden.img)
sync
OUT=c.img
loop_time 5 "'$VMSNAP' disk clone golden.img c.img"
v_ms=$MS
row "clone 4G/100M: vmsnap clone (ext4: extent walk)" "$MS" "$CPUMS" "$(kib "$(alloc c.img)")" "1.0"
cmp -s golden.img c.img || { echo "clone differs" >&2; exit 1; }
loop_time 5 "cp --sparse=always golden.img c.img"
row "clone 4G/100M: cp --sparse=always" "$MS" "$CPUMS" "$(kib "$(alloc c.img)")" "$(ratio "$MS" "$v_ms")"
loop_time 5 "cp --reflink=never golden.img c.img"
row "clone 4G/100M: cp --reflink=never" "$MS" "$CPUMS" "$(kib "$(alloc c.img)")" "$(ratio "$MS" "$v_ms")"
cat >cfr.py <<'PYEOF'
import os, sys
s = os.open(sys.argv[1], os.O_RDONLY); d = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
n = os.fstat(s).st_size; off = 0
while off < n:
    off += os.copy_file_range(s, d, n - off, off, off)
PYEOF
loop_time 1 "python3 cfr.py golden.img c.img"
row "clone 4G/100M: plain copy_file_range (whole file)" "$MS" "$CPUMS" "$(kib "$(alloc c.img)")" "$(ratio "$MS" "$v_ms")"
rm -f c.img
if [ "$(id -u)" = 0 ] && command -v mkfs.xfs >/dev/null; then
    truncate -s 2G xfs.fs && mkfs.xfs -q -m reflink=1 xfs.fs && mkdir -p "$XFS" && mount -o loop xfs.fs "$XFS"
    cp --sparse=always golden.img "$XFS/golden.img" && sync
    OUT=$XFS/c.img
    loop_time 21 "'$VMSNAP' disk clone $XFS/golden.img $XFS/c.img"
    x_ms=$MS
    row "clone 4G/100M on XFS: vmsnap clone (FICLONE)" "$MS" "$CPUMS" "shared" "$(ratio "$MS" "$v_ms")"
    loop_time 21 "cp --reflink=always $XFS/golden.img $XFS/c.img"
    row "clone 4G/100M on XFS: cp --reflink=always" "$MS" "$CPUMS" "shared" "$(ratio "$MS" "$v_ms")"
    umount "$XFS"
fi

# 4. golden clone + UUID patch vs a fresh create (4 GiB, seeded)
"$VMSNAP" disk create --size 4G $ADDS gold.img
OUT="g.img v.img m.img"
loop_time $N "'$VMSNAP' disk clone --new-uuid gold.img g.img"
g_ms=$MS
row "golden clone --new-uuid (4G seeded)" "$MS" "$CPUMS" "$(kib "$(alloc g.img)")" "1.0"
e2fsck -fn g.img >/dev/null 2>&1 || { echo "uuid clone not clean" >&2; exit 1; }
loop_time $N "'$VMSNAP' disk create --size 4G $ADDS v.img"
row "fresh vmsnap disk create (4G seeded)" "$MS" "$CPUMS" "$(kib "$(alloc v.img)")" "$(ratio "$MS" "$g_ms")"
loop_time $N "mke2fs -q -F -t ext4 -O ^has_journal -d seedtree m.img 4G"
row "fresh mke2fs -d (4G seeded)" "$MS" "$CPUMS" "$(kib "$(alloc m.img)")" "$(ratio "$MS" "$g_ms")"
mf_ms=$MS
for b in "${DISK_BINS[@]}"; do
    loop_time $N "${b%%|*} clone-new-uuid gold.img g.img"
    row "golden clone --new-uuid: ${b#*|}" "$MS" "$CPUMS" "$(kib "$(alloc g.img)")" "$(ratio "$MS" "$g_ms") (mke2fs/this: $(ratio "$mf_ms" "$MS"))"
done
loop_time $N "/bin/true"
row "process start alone (/bin/true)" "$MS" "$CPUMS" "-" "-"
loop_time $N "'$VMSNAP' version"
row "process start alone (vmsnap version)" "$MS" "$CPUMS" "-" "-"
floor_ms=""
if [ -n "$FLOOR" ]; then
    loop_time $N "$FLOOR"
    floor_ms=$MS
    row "process start alone (static empty program: the floor)" "$MS" "$CPUMS" "-" "-"
fi

echo "vmsnap disk benchmark, $(date -u +%Y-%m-%d), $(nproc) CPUs, kernel $(uname -r), on $(stat -f -c %T "$W") ($W)"
echo "golden image for the clone rows: 4 GiB virtual, $(kib "$G_ALLOC") KiB allocated"
echo
echo "| case | wall ms (median) | CPU ms (mean) | allocated KiB | wall vs first row of group |"
echo "|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
if [ -n "$floor_ms" ]; then
    echo
    echo "Process floor here: $floor_ms ms. Best whole-process ratio any binary could reach against"
    echo "mke2fs: seeded 4G create $(ratio "$m4_ms" "$floor_ms")x (mke2fs $m4_ms ms), golden clone vs fresh"
    echo "mke2fs $(ratio "$mf_ms" "$floor_ms")x (mke2fs $mf_ms ms), i.e. if the disk work itself took no time."
fi
