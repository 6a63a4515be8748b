#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Codec benchmark: a 2 GiB guest-memory-like image (about 25% allocated: text, ELF, random and
# zero pages, holes between) on tmpfs, as guest RAM lives, packed and unpacked by vmsnap and by
# the tools a user would pick instead, side by side in one run. Prints a Markdown table.
#   bench/codec.sh [path/to/vmsnap]      BENCH_REPS=3 (median of N runs)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/bench/lib.sh"
VMSNAP=$(realpath "${1:-$here/build/vmsnap}")
for t in zstd pzstd tar bc; do command -v $t >/dev/null || { echo "need $t (scripts/deps.sh bench)"; exit 1; }; done
W=$(mktemp -d /dev/shm/vmsnap-bench.XXXXXX)
trap 'rm -rf "$W"' EXIT
SIZE_MIB=${SIZE_MIB:-2048}
python3 "$here/scripts/gen-guest-image.py" "$W/memory-ranges" "$SIZE_MIB" 0.25 1
alloc=$(du -B1 "$W/memory-ranges" | cut -f1)
cd "$W"

rows=()
row() { # label wall cpu rss size
    rows+=("| $1 | $2 | $3 | $4 | $5 |")
}
size_of() { stat -c %s "$1"; }

bench_run "vmsnap pack -j1" "rm -f p1.vs; '$VMSNAP' -q pack -j1 memory-ranges p1.vs"; P1=$WALL; PACK1_CPU=$CPU
row "vmsnap pack -j1" "$WALL" "$CPU" "$RSS_MIB" "$(size_of p1.vs)"
bench_run "vmsnap pack -j2" "rm -f p2.vs; '$VMSNAP' -q pack -j2 memory-ranges p2.vs"; P2=$WALL; PACK2_CPU=$CPU
row "vmsnap pack -j2" "$WALL" "$CPU" "$RSS_MIB" "$(size_of p2.vs)"; P2SIZE=$(size_of p2.vs)
cmp -s p1.vs p2.vs || { echo "pack -j1 and -j2 outputs differ" >&2; exit 1; }
bench_run "zstd -1 -T0" "zstd -q -1 -T0 -f memory-ranges -o z.zst"; Z=$WALL
row "zstd -1 -T0 (whole file)" "$WALL" "$CPU" "$RSS_MIB" "$(size_of z.zst)"; ZSIZE=$(size_of z.zst)
bench_run "pzstd -1 -p 2" "pzstd -q -1 -p 2 -f memory-ranges -o pz.zst"
row "pzstd -1 -p 2" "$WALL" "$CPU" "$RSS_MIB" "$(size_of pz.zst)"
bench_run "tar -S | zstd" "tar -S -cf - memory-ranges | zstd -q -1 -T0 > t.tar.zst"; TZ=$WALL
row "tar -S \\| zstd -1 -T0" "$WALL" "$CPU" "$RSS_MIB" "$(size_of t.tar.zst)"

BENCH_BEFORE='rm -f out.* ; mkdir -p tx && rm -rf tx/*'
bench_run "vmsnap unpack -j1" "'$VMSNAP' -q unpack -j1 p2.vs out.v1"; U1=$WALL; UNPACK1_CPU=$CPU
row "vmsnap unpack -j1" "$WALL" "$CPU" "$RSS_MIB" "-"
bench_run "vmsnap unpack -j2" "'$VMSNAP' -q unpack -j2 p2.vs out.v2"; U2=$WALL; UNPACK2_CPU=$CPU
row "vmsnap unpack -j2" "$WALL" "$CPU" "$RSS_MIB" "-"
"$VMSNAP" -q unpack -j2 p2.vs out.check && cmp memory-ranges out.check
UALLOC=$(du -B1 out.check | cut -f1); rm -f out.check
bench_run "zstd -d" "zstd -q -d -f z.zst -o out.z"; ZD=$WALL
row "zstd -d" "$WALL" "$CPU" "$RSS_MIB" "-"
bench_run "pzstd -d" "pzstd -q -d -p 2 -f pz.zst -o out.pz"
row "pzstd -d -p 2" "$WALL" "$CPU" "$RSS_MIB" "-"
bench_run "zstd -d | tar -xS" "zstd -q -d -c t.tar.zst | tar -xSf - -C tx"
row "zstd -d \\| tar -xS" "$WALL" "$CPU" "$RSS_MIB" "-"

echo "### Codec, $(date -u +%Y-%m-%d), $(machine_line)"
echo
echo "Image: ${SIZE_MIB} MiB logical, $((alloc >> 20)) MiB allocated, on tmpfs; outputs on tmpfs."
echo "zstd $(zstd -V | grep -o 'v[0-9.]*'), median of $BENCH_REPS runs; CPU = user+sys seconds, children included."
echo
echo "| command | wall s | CPU s | peak RSS MiB | output bytes |"
echo "|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
r() { echo "scale=2; $1 / $2" | bc; }
echo "- pack -j2 vs -j1: $(r "$P1" "$P2")x faster (target >= 1.8x)"
echo "- pack -j2 vs zstd -1 -T0 of the whole file: $(r "$Z" "$P2")x faster (target >= 3x); output $(r "$P2SIZE" "$ZSIZE")x the size (target <= 1)"
echo "- pack -j2 vs tar -S | zstd: $(r "$TZ" "$P2")x faster"
echo "- unpack -j2 vs -j1: $(r "$U1" "$U2")x; unpack -j2 vs zstd -d: $(r "$ZD" "$U2")x faster (target >= 2x)"
echo "- restored file allocates $((UALLOC >> 20)) MiB (sparse; source allocates $((alloc >> 20)) MiB)"
# the machine's limit with the pack's own parameters (bench/zlimit.c: libzstd and XXH64 over the
# image's non-zero pages in memory, one frame per 64 MiB range, best of 3)
ZL=$(dirname "$VMSNAP")/vmsnap_zlimit
if [ -x "$ZL" ]; then
    declare -A L
    while IFS='=' read -r k v; do L[$k]=$v; done < <("$ZL" memory-ranges 2)
    echo "- limit (libzstd level 1, pack's parameters, $((${L[bytes]} >> 20)) MiB of non-zero pages in memory):" \
        "compress 1 thread ${L[compress_1]} s, 2 threads ${L[compress_n]} s; decompress ${L[decompress_1]} / ${L[decompress_n]} s; XXH64 ${L[xxh64_1]} s"
    echo "- pack -j1 at $(r "${L[compress_1]}" "$P1")x of 1-thread compression (wall), CPU $PACK1_CPU s = $(r "$PACK1_CPU" "${L[compress_1]}")x libzstd's time (target <= 1.15x);" \
        "pack -j2 at $(r "${L[compress_n]}" "$P2")x of the 2-thread limit (target >= 0.85)"
    echo "- unpack -j1 at $(r "${L[decompress_1]}" "$U1")x of 1-thread decompression; unpack -j2 at $(r "${L[decompress_n]}" "$U2")x of the 2-thread limit (target >= 0.70)"
    # CPU seconds against libzstd's own CPU seconds: what a machine shared with other work
    # distorts least (wall time there measures the neighbours as much as the codec)
    if [ -n "${L[compress_1_cpu]:-}" ]; then
        echo "- CPU against libzstd's CPU (compress ${L[compress_1_cpu]} s, decompress ${L[decompress_1_cpu]} s on 1 thread):" \
            "pack -j1 $(r "$PACK1_CPU" "${L[compress_1_cpu]}")x, pack -j2 $(r "$PACK2_CPU" "${L[compress_1_cpu]}")x;" \
            "unpack -j1 $(r "$UNPACK1_CPU" "${L[decompress_1_cpu]}")x, unpack -j2 $(r "$UNPACK2_CPU" "${L[decompress_1_cpu]}")x"
    fi
fi
# what page tables cost (#23; bench/pages.c): vmsnap_pages_hash_fd over the image on 1 and 2
# threads, and pack -j2 into a sink that drops the bytes without and with pages_out (best of 3)
PB=$(dirname "$VMSNAP")/vmsnap_pagebench
if [ -x "$PB" ]; then
    declare -A G
    while IFS='=' read -r k v; do G[$k]=$v; done < <("$PB" memory-ranges 2)
    echo "- page table (XXH3 per 4 KiB page, ${G[populated]} of ${G[pages]} pages populated, a $((G[pages] * 8 >> 20)) MiB table):" \
        "vmsnap_pages_hash_fd 1 thread ${G[hash_1_wall]} s wall / ${G[hash_1_cpu]} s CPU, 2 threads ${G[hash_n_wall]} / ${G[hash_n_cpu]} s"
    echo "- pack -j2 with pages_out ${G[pack_pages_wall]} s wall / ${G[pack_pages_cpu]} s CPU, without ${G[pack_wall]} / ${G[pack_cpu]} s" \
        "(CPU $(r "${G[pack_pages_cpu]}" "${G[pack_cpu]}")x); a delta of the unchanged image over its own table ${G[delta_same_wall]} / ${G[delta_same_cpu]} s (${G[delta_same_bytes]} bytes)"
fi
