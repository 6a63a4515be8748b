#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Stop the RGW started by tests/rgw-up.sh STATE_DIR: kill the daemons by their own pid files
# (never by name), then remove STATE_DIR. KEEP=1 keeps the state (logs) for debugging.
STATE=${1:?usage: rgw-down.sh STATE_DIR}
[ -d "$STATE/run" ] || { echo "nothing to stop in $STATE"; exit 0; }
stop() {
    local pf=$1 pid
    [ -f "$pf" ] || return 0
    pid=$(cat "$pf")
    [[ "$pid" =~ ^[0-9]+$ ]] || return 0
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
}
for n in client.rgw.a osd.0 mon.a; do stop "$STATE/run/$n.pid"; done
stop "$STATE/run/rgw.bgpid"
if [ "${KEEP:-0}" != 1 ]; then rm -rf "$STATE"; fi
echo stopped
