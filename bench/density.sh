#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Density benchmark (issue #25 item 7), the reference system's glutton and density scenarios
# on one node: VMS test guests of MEM_MIB, CLIENTS concurrent clients cycling for DURATION
# seconds (resume the VM's last set, dirty DIRTY_MIB of guest RAM, suspend to a new layered set)
# against a co-located Ceph RGW started here; once through vmsnapd ("daemon"), once with one
# `vmsnap` process per operation ("cli"), same workload, same run. Reports throughput, resume
# and suspend p50/p90/p99, failures, the node's memory peak (guests + daemon or CLI processes;
# the daemon's own peak RSS separately), the object cache's hit rate and the node's CPU busy
# share. The driver is bench/density.py. Starts and stops everything it needs (RGW, a tmpfs for
# guest RAM, the daemon, the guests) and removes its directory.
#
#   bench/density.sh [BUILD_DIR]   env: VMS=8 MEM_MIB=256 CLIENTS=4 DURATION=180 DIRTY_MIB=32
#                                       MODES="daemon cli" DAEMON_SET="workers=2 memory=512M"
#                                       (vmsnapd --set KEY=VALUE, space separated) SEED=1
#                                       a mode daemon.LABEL: a daemon with DAEMON_SET_LABEL too,
#                                       e.g. MODES="daemon daemon.old cli"
#                                       DAEMON_SET_old="bulk_workers=2 bulk_nice=0"
#                                       BENCH_DIR=/var/tmp RGW_GIB=64 (the store's sparse
#                                       OSD file; a run of 3 modes wrote over 20 GiB)
#   smoke:  VMS=2 CLIENTS=2 DURATION=30 bench/density.sh
# Runs under TCG here (--accel auto: no vmx/svm): the figures are for ratios.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(realpath "${1:-$here/build}")
export VMSNAP=$BUILD/vmsnap VMSNAPD=$BUILD/vmsnapd
for b in "$VMSNAP" "$VMSNAPD"; do
    [ -x "$b" ] || { echo "bench/density.sh: build first ($b missing)" >&2; exit 1; }
done
command -v radosgw >/dev/null || { echo "bench/density.sh: needs Ceph (scripts/deps.sh s3)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "bench/density.sh: needs root (a tmpfs for guest RAM)" >&2; exit 1; }
export G
G=$(bash "$here/guest/build.sh")
export W
W=$(mktemp -d "${BENCH_DIR:-/var/tmp}/vmsnap-density.XXXXXX")
RGW=$W/rgw
export VMSNAP_RAM_DIR=$W/ram VMSNAP_ASSET_DIRS=$G
mkdir -p "$VMSNAP_RAM_DIR" "$W/state"
VMS=${VMS:-8}
MEM_MIB=${MEM_MIB:-256}
# guest RAM, each stage (a suspend's renamed RAM file, a resume's decoded image) and a margin
mount -t tmpfs -o size=$((VMS * MEM_MIB * 2 + 1024))M tmpfs "$VMSNAP_RAM_DIR"
cleanup() {
    local n p
    # the daemon the driver started, by the pid it wrote (a driver killed mid-mode leaves it)
    p=$(cat "$W/vmsnapd.pid" 2>/dev/null || true)
    [[ "$p" =~ ^[0-9]+$ ]] && kill "$p" 2>/dev/null || true
    for n in $(ls "$W/state/vms" 2>/dev/null); do
        "$VMSNAP" vm stop --rm --state-dir "$W/state" "$n" >/dev/null 2>&1 || true
    done
    bash "$here/tests/rgw-down.sh" "$RGW" >/dev/null 2>&1 || true
    umount "$VMSNAP_RAM_DIR" 2>/dev/null || true
    rm -rf "$W"
}
trap cleanup EXIT
# the store's OSD: a quiet machine's three-mode run (~200 cycles per mode) wrote over 20 GiB and
# filled the tests' default, whose full OSD then blocked every suspend of the last mode
need=$((${RGW_GIB:-64} / 2))
free=$(($(df -k --output=avail "$W" | tail -1) >> 20))
[ "$free" -ge "$need" ] || echo "bench/density.sh: warning: $free GiB free under $W, a long run may need $need" >&2
VMSNAP_RGW_BLOCK_GIB=${RGW_GIB:-64} bash "$here/tests/rgw-up.sh" "$RGW" >"$W/rgw.log" 2>&1 || { echo "RGW did not start: $(tail -5 "$W/rgw.log")" >&2; exit 1; }
. "$RGW/env"
export AWS_ENDPOINT_URL AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
export BUCKET=densitybench-$$
curl -sS --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
    -H "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" \
    -X PUT "$AWS_ENDPOINT_URL/$BUCKET" >/dev/null
# the daemon reaches the store only through a node profile: its keys in its own credentials file
printf '[rgw]\naws_access_key_id = %s\naws_secret_access_key = %s\n' \
    "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" >"$W/aws-credentials"
chmod 600 "$W/aws-credentials"
# warm RGW up (its first writes are slow) before anything is timed
head -c $((48 << 20)) /dev/urandom >"$W/warm"
"$VMSNAP" -q push "$W/warm" "s3://$BUCKET/warm" && "$VMSNAP" -q rm "s3://$BUCKET/warm"
rm -f "$W/warm"
echo "density, $(date -u '+%Y-%m-%d %H:%M') UTC, $(nproc) CPUs, load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
VMS=$VMS MEM_MIB=$MEM_MIB python3 "$here/bench/density.py"
