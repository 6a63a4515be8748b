#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Transfer benchmark: the codec bench's 2 GiB guest-memory-like image (25% allocated) pushed and
# pulled through a loopback Ceph RGW (started here with tests/rgw-up.sh) and the local store, side
# by side in one run with rclone copyto of the raw file, zstd -1 -T0 | rclone rcat, and aws s3 cp
# when installed. Prints a Markdown table: wall s, client CPU s (user+sys), CPU s per populated
# GiB, peak RSS, bytes sent. On 2 cores RGW itself takes most of the CPU.
#   bench/transfer.sh [path/to/vmsnap]     BENCH_REPS=1  SIZE_MIB=2048  J=8
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/bench/lib.sh"
BENCH_REPS=${BENCH_REPS:-1}
VMSNAP=$(realpath "${1:-$here/build/vmsnap}")
J=${J:-8}
for t in rclone zstd bc curl; do command -v $t >/dev/null || { echo "need $t (scripts/deps.sh bench s3)"; exit 1; }; done
W=$(mktemp -d /dev/shm/vmsnap-xbench.XXXXXX)
STATE=$(mktemp -d /tmp/vmsnap-xbench-rgw.XXXXXX)
FPIDS=()
trap '[ ${#FPIDS[@]} = 0 ] || kill "${FPIDS[@]}" 2>/dev/null; bash "$here/tests/rgw-down.sh" "$STATE" >/dev/null 2>&1; rm -rf "$W"' EXIT
bash "$here/tests/rgw-up.sh" "$STATE" >/dev/null 2>&1
. "$STATE/env"
SIZE_MIB=${SIZE_MIB:-2048}
python3 "$here/scripts/gen-guest-image.py" "$W/memory-ranges" "$SIZE_MIB" 0.25 1
pop=$(du -B1 "$W/memory-ranges" | cut -f1)
B=bench
curl -sS -o /dev/null --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
    -H "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" -X PUT "$AWS_ENDPOINT_URL/$B"
export RCLONE_CONFIG_RGW_TYPE=s3 RCLONE_CONFIG_RGW_PROVIDER=Ceph RCLONE_CONFIG_RGW_ENDPOINT=$AWS_ENDPOINT_URL
export RCLONE_CONFIG_RGW_ACCESS_KEY_ID=$AWS_ACCESS_KEY_ID RCLONE_CONFIG_RGW_SECRET_ACCESS_KEY=$AWS_SECRET_ACCESS_KEY
RC="env -u AWS_CA_BUNDLE rclone --s3-upload-concurrency $J --multi-thread-streams $J --s3-chunk-size 16M"
cd "$W"
rows=()
row() { # label wall cpu rss bytes
    local per
    per=$(echo "scale=2; $3 / ($pop / 1073741824)" | bc)
    rows+=("| $1 | $2 | $3 | $per | $4 | $5 |")
}
BENCH_BEFORE='rm -rf out*'
bench_run "vmsnap pack" "'$VMSNAP' -q pack memory-ranges p.vs"; PACK_CPU=$CPU
row "vmsnap pack (no transfer)" "$WALL" "$CPU" "$RSS_MIB" "-"
OBJ=$(stat -c %s p.vs)
bench_run "vmsnap push s3" "'$VMSNAP' -q push -j $J memory-ranges s3://$B/v/mr"; VP=$WALL; VPC=$CPU
row "vmsnap push -j$J (RGW)" "$WALL" "$CPU" "$RSS_MIB" "$OBJ"
bench_run "vmsnap pull s3" "'$VMSNAP' -q pull -j $J s3://$B/v/mr out.v"; VG=$WALL
row "vmsnap pull -j$J (RGW)" "$WALL" "$CPU" "$RSS_MIB" "$OBJ"
cmp -s memory-ranges out.v || { echo "vmsnap pull differs" >&2; exit 1; }
# a later version of the image with 8 of its 32 64 MiB ranges rewritten (1 MiB of random bytes
# at each range's start): pushed with the first object as its base, the rest is copied by RGW
cp --sparse=always memory-ranges mr2
for k in $(seq 0 4 $((SIZE_MIB / 64 - 1))); do
    dd if=/dev/urandom of=mr2 bs=1M count=1 seek=$((k * 64)) conv=notrunc status=none
done
"$VMSNAP" -q push -j $J memory-ranges s3://$B/v/base
bench_run "vmsnap push --base s3" "'$VMSNAP' -q push -j $J --base s3://$B/v/base mr2 s3://$B/v/mr2"; VB=$WALL
"$VMSNAP" push -j $J --base s3://$B/v/base mr2 s3://$B/v/mr2 2>push-base.log
COPIED=$(sed -n 's/^push: \([0-9.]*\) MiB of the object bytes copied.*/\1/p' push-base.log)
OBJB=$(python3 -c "import re; print(int(float(re.search(r'object bytes ([0-9.]+) MiB',open('push-base.log').read()).group(1))*1048576))")
SENT=$(python3 -c "import sys; print(int(int(sys.argv[1]) - float(sys.argv[2] or 0) * 1048576))" "$OBJB" "$COPIED")
row "vmsnap push -j$J --base (8 of 32 ranges changed; RGW copies ${COPIED:-0} MiB)" "$WALL" "$CPU" "$RSS_MIB" "$SENT"
bench_run "vmsnap push (same, no base) s3" "'$VMSNAP' -q push -j $J mr2 s3://$B/v/mr3"; VNB=$WALL
row "vmsnap push -j$J of the same without a base (RGW)" "$WALL" "$CPU" "$RSS_MIB" "$OBJB"
"$VMSNAP" -q pull -j $J s3://$B/v/mr2 out.b && cmp -s mr2 out.b || { echo "pull of the base push differs" >&2; exit 1; }
rm -f out.b
# a VM-like set (the image and four small files) pulled through tests/faultproxy adding 0 ms and
# 20 ms to every request, as an S3 endpoint's first-byte latency would: the difference is what
# the request round trips cost (opening the set's files in parallel keeps it to a few)
FPX=$(dirname "$VMSNAP")/tests/vmsnap_faultproxy
LAT=()
if [ -x "$FPX" ]; then
    mkdir -p set && ln -f memory-ranges set/memory-ranges
    head -c 60000 /dev/urandom >set/state && echo '{"vcpus":1}' >set/config.json && echo lineage >set/base-id
    "$VMSNAP" disk create --size 1G set/rootfs-disk-vda.ext4
    "$VMSNAP" -q push -j $J set s3://$B/set
    for ms in 0 20; do
        rm -f "$W/fp$ms.port"
        "$FPX" "$W/fp$ms.port" "$VMSNAP_RGW_PORT" "1+:delay$ms" >/dev/null 2>&1 &
        FPIDS+=($!)
        for _ in $(seq 50); do [ -s "$W/fp$ms.port" ] && break; sleep 0.1; done
        BENCH_BEFORE='rm -rf outset'
        bench_run "vmsnap pull set +${ms}ms" "AWS_ENDPOINT_URL=http://127.0.0.1:$(cat "$W/fp$ms.port") '$VMSNAP' -q pull -j $J s3://$B/set outset"
        LAT+=("$WALL")
        row "vmsnap pull -j$J of a 5-file set through a proxy adding $ms ms per request" "$WALL" "$CPU" "$RSS_MIB" "-"
    done
    BENCH_BEFORE='rm -rf out*'
fi
bench_run "vmsnap push local" "'$VMSNAP' -q push -j $J memory-ranges $W/store/mr"
row "vmsnap push -j$J (local store, tmpfs)" "$WALL" "$CPU" "$RSS_MIB" "$OBJ"
bench_run "vmsnap pull local" "'$VMSNAP' -q pull -j $J $W/store/mr out.l"
row "vmsnap pull -j$J (local store, tmpfs)" "$WALL" "$CPU" "$RSS_MIB" "$OBJ"
bench_run "rclone copyto up" "$RC copyto --ignore-times memory-ranges rgw:$B/r/mr"; RP=$WALL
row "rclone copyto raw (up)" "$WALL" "$CPU" "$RSS_MIB" "$((SIZE_MIB * 1048576))"
bench_run "rclone copyto down" "$RC copyto --ignore-times rgw:$B/r/mr out.r"; RG=$WALL
row "rclone copyto raw (down)" "$WALL" "$CPU" "$RSS_MIB" "$((SIZE_MIB * 1048576))"
bench_run "zstd|rclone rcat" "zstd -q -1 -T0 -c memory-ranges | $RC rcat rgw:$B/z/mr.zst"; ZP=$WALL
ZS=$(env -u AWS_CA_BUNDLE rclone size --json rgw:$B/z/mr.zst | sed 's/.*"bytes":\([0-9]*\).*/\1/')
row "zstd -1 -T0 \\| rclone rcat (up)" "$WALL" "$CPU" "$RSS_MIB" "$ZS"
bench_run "rclone cat|zstd -d" "$RC cat rgw:$B/z/mr.zst | zstd -q -d -o out.z"; ZG=$WALL
row "rclone cat \\| zstd -d (down)" "$WALL" "$CPU" "$RSS_MIB" "$ZS"
if command -v aws >/dev/null && aws --version >/dev/null 2>&1; then
    export AWS_MAX_CONCURRENT_REQUESTS=$J
    bench_run "aws s3 cp up" "aws --endpoint-url $AWS_ENDPOINT_URL s3 cp --only-show-errors memory-ranges s3://$B/a/mr"
    row "aws s3 cp raw (up)" "$WALL" "$CPU" "$RSS_MIB" "$((SIZE_MIB * 1048576))"
    bench_run "aws s3 cp down" "aws --endpoint-url $AWS_ENDPOINT_URL s3 cp --only-show-errors s3://$B/a/mr out.a"
    row "aws s3 cp raw (down)" "$WALL" "$CPU" "$RSS_MIB" "$((SIZE_MIB * 1048576))"
fi
echo "### Transfer, $(date -u +%Y-%m-%d), $(machine_line)"
echo
echo "Image: ${SIZE_MIB} MiB logical, $((pop / 1048576)) MiB populated; loopback RGW 16.2 (bluestore on a sparse file), -j $J, reps $BENCH_REPS."
echo
echo "| tool | wall s | client CPU s | CPU s / populated GiB | peak RSS MiB | bytes sent |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
[ ${#LAT[@]} = 2 ] && printf 'set pull: 20 ms per request cost %.3f s over the proxy without delay\n' "$(echo "${LAT[1]} - ${LAT[0]}" | bc -l)"
printf 'push --base vs the same push without a base: %.2fx (bytes sent %s of %s)\n' "$(echo "$VNB / $VB" | bc -l)" "$SENT" "$OBJB"
printf 'push vs rclone copyto: %.2fx, vs zstd|rclone rcat: %.2fx; pull vs rclone copyto: %.2fx, vs rclone cat|zstd: %.2fx; push CPU / pack CPU: %.2f\n' \
    "$(echo "$RP / $VP" | bc -l)" "$(echo "$ZP / $VP" | bc -l)" "$(echo "$RG / $VG" | bc -l)" "$(echo "$ZG / $VG" | bc -l)" "$(echo "$VPC / $PACK_CPU" | bc -l)"
