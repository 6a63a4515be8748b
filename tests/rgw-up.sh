#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Start a throw-away Ceph RGW on 127.0.0.1 for the S3 tests (one mon, one OSD on a sparse
# bluestore file, radosgw, auth none), following docs in ../shared/reference/ceph-rgw.md.
#
#   tests/rgw-up.sh STATE_DIR       env: VMSNAP_RGW_BLOCK_GIB=20 (the OSD's sparse block file;
#                                   a full OSD blocks every write, it does not fail them)
#
# STATE_DIR (e.g. <build>/rgw) holds every file of the cluster; ports are picked free at start,
# so a normal and an ASan build (or two checkouts) never collide. On success STATE_DIR/env holds
# the variables the tests source (endpoint, keys, bucket) and the script exits 0. Exits 77 if Ceph
# is not installed (tests/rgw-down.sh stops everything by pid file).
set -euo pipefail
STATE=${1:?usage: rgw-up.sh STATE_DIR}
for b in ceph-mon ceph-osd radosgw radosgw-admin monmaptool ceph-authtool ceph uuidgen curl; do
    if ! command -v "$b" >/dev/null; then
        echo "SKIP: $b not installed (scripts/deps.sh s3)" >&2
        [ "${VMSNAP_REQUIRE_ALL:-0}" = 1 ] && exit 1
        exit 77
    fi
done
# a leftover from an interrupted run: stop it first
if [ -d "$STATE" ]; then
    bash "$(dirname "$0")/rgw-down.sh" "$STATE" >/dev/null 2>&1 || true
fi
mkdir -p "$STATE"/{run,log,mon.a,osd.0,rgw}
chmod 700 "$STATE"

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pick_port() {
    local p
    for _ in $(seq 1 200); do
        p=$((20000 + RANDOM % 30000))
        if port_free "$p" && [[ " ${USED:-} " != *" $p "* ]]; then
            USED="${USED:-} $p"
            echo "$p"
            return 0
        fi
    done
    echo "no free port" >&2
    return 1
}
RGW_PORT=$(pick_port)
MON_V2=$(pick_port)
MON_V1=$(pick_port)
ACCESS=vmsnaptest
SECRET=$(head -c 24 /dev/urandom | base64 | tr -d '/+=' | head -c 32)
CONF=$STATE/ceph.conf
FSID=$(uuidgen)

cat >"$CONF" <<CONF
[global]
fsid = $FSID
mon host = [v2:127.0.0.1:$MON_V2,v1:127.0.0.1:$MON_V1]
public addr = 127.0.0.1
ms bind ipv6 = false
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = true
run dir = $STATE/run
admin socket = $STATE/run/\$name.asok
pid file = $STATE/run/\$name.pid
log file = $STATE/log/\$name.log
keyring = $STATE/keyring
crash dir = $STATE/crash
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon max pg per osd = 1000
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
mon data avail warn = 2
mon data avail crit = 1
debug ms = 0

[mon.a]
mon data = $STATE/mon.a

[osd.0]
osd data = $STATE/osd.0
osd objectstore = bluestore
bluestore block path = $STATE/osd0-block.img
bluestore block create = true
bluestore block size = $((${VMSNAP_RGW_BLOCK_GIB:-20} << 30))
bluestore block db create = false
bluestore block wal create = false
osd memory target = 1073741824

[client.rgw.a]
rgw data = $STATE/rgw
rgw frontends = beast endpoint=127.0.0.1:$RGW_PORT
rgw thread pool size = 64
rgw gc obj min wait = 10
rgw gc processor period = 10
log file = $STATE/log/rgw.log
ms mon client mode = crc secure
CONF

C=(-c "$CONF")
fail() { echo "rgw-up: $*" >&2; bash "$(dirname "$0")/rgw-down.sh" "$STATE" >/dev/null 2>&1 || true; exit 1; }
ceph-authtool --create-keyring "$STATE/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
ceph-authtool "$STATE/keyring" --gen-key -n client.admin --cap mon 'allow *' --cap osd 'allow *' >/dev/null
monmaptool --create --fsid "$FSID" --addv a "[v2:127.0.0.1:$MON_V2,v1:127.0.0.1:$MON_V1]" "$STATE/monmap" >/dev/null
ceph-mon "${C[@]}" --mkfs -i a --monmap "$STATE/monmap" --keyring "$STATE/keyring" || fail "mon mkfs"
ceph-mon "${C[@]}" -i a || fail "mon start"
OSD_UUID=$(uuidgen)
OSD_ID=$(timeout 60 ceph "${C[@]}" osd new "$OSD_UUID") || fail "osd new"
[ "$OSD_ID" = 0 ] || fail "unexpected osd id $OSD_ID"
ceph-osd "${C[@]}" -i 0 --mkfs --osd-uuid "$OSD_UUID" 2>>"$STATE/log/osd-mkfs.log" || fail "osd mkfs (see $STATE/log)"
ceph-osd "${C[@]}" -i 0 || fail "osd start"
up=0
for _ in $(seq 1 120); do
    if timeout 10 ceph "${C[@]}" osd stat 2>/dev/null | grep -q '1 up'; then up=1; break; fi
    sleep 0.5
done
[ "$up" = 1 ] || fail "osd did not come up"
# radosgw creates its pools on first start and then opens its port. On a loaded machine that
# first start has been seen to stall without ever answering; a restart (pools now exist) comes up
# in seconds. So: up to 75 s per attempt, three attempts, and the log tail on failure.
start_rgw() {
    setsid radosgw "${C[@]}" -n client.rgw.a -f </dev/null >>"$STATE/log/rgw.stdout" 2>&1 &
    echo $! >"$STATE/run/rgw.bgpid"
}
stop_rgw() {
    local pid
    pid=$(cat "$STATE/run/rgw.bgpid" 2>/dev/null) || return 0
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
}
code=000
for attempt in 1 2 3; do
    start_rgw
    for _ in $(seq 1 150); do
        code=$(curl -s -m 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$RGW_PORT/" || true)
        [ "$code" = 200 ] && break
        sleep 0.5
    done
    [ "$code" = 200 ] && break
    echo "rgw-up: radosgw attempt $attempt did not answer (last code $code); log tail:" >&2
    tail -n 15 "$STATE/log/rgw.log" "$STATE/log/rgw.stdout" >&2 2>/dev/null || true
    stop_rgw
done
[ "$code" = 200 ] || fail "radosgw did not answer after 3 attempts (last code $code)"
radosgw-admin "${C[@]}" user create --uid=test --display-name="vmsnap test" \
    --access-key="$ACCESS" --secret-key="$SECRET" >/dev/null || fail "user create"
cat >"$STATE/env" <<ENV
export AWS_ENDPOINT_URL=http://127.0.0.1:$RGW_PORT
export AWS_ACCESS_KEY_ID=$ACCESS
export AWS_SECRET_ACCESS_KEY=$SECRET
export AWS_REGION=us-east-1
export VMSNAP_RGW_PORT=$RGW_PORT
ENV
chmod 600 "$STATE/env"
echo "RGW ready on http://127.0.0.1:$RGW_PORT (state $STATE)"
