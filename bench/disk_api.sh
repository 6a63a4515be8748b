#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# `disk create` of a seeded 4 GiB image (a tree of three files, /etc/resolv.conf, hosts,
# hostname, as --from-dir) through vmsnapd's API against a `mke2fs -t ext4 -O ^has_journal -d`
# process, side by side in one run (issue #25's done-when: the API at most a tenth of mke2fs).
# Rounds alternate the two so the machine's load hits both alike. API: one kept-alive HTTP
# connection over the unix socket (as a control plane's client keeps one), POST
# /v1/disks/create, then GET /v1/operations/ID?wait= until it is done; wall = from the POST to
# the done answer, CPU = the daemon's threads' CPU time (schedstat, ns) over the run, per
# create, plus the client's own. mke2fs: a process exec'd directly (as a worker spawns one),
# wall and CPU of the child (rusage). Output files removed between runs, outside the timing.
# Also the CLI (`vmsnap disk create --from-dir`) as a process, for reference. Prints Markdown.
#   bench/disk_api.sh [BUILD_DIR]      env: REPS=10 (median over REPS; CPU over CPU_REPS=200)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(realpath "${1:-$here/build}")
for t in mke2fs python3; do command -v $t >/dev/null || { echo "need $t" >&2; exit 1; }; done
[ -x "$BUILD/vmsnapd" ] || { echo "bench/disk_api.sh: $BUILD/vmsnapd not built" >&2; exit 1; }
W=$(mktemp -d "${BENCH_DIR:-/var/tmp}/vmsnap-diskapi.XXXXXX")
DPID=
cleanup() {
    [ -z "$DPID" ] || { kill "$DPID" 2>/dev/null; wait "$DPID" 2>/dev/null || true; }
    rm -rf "$W"
}
trap cleanup EXIT
mkdir -p "$W/seedtree/etc"
echo "nameserver 10.0.0.1" >"$W/seedtree/etc/resolv.conf"
printf '127.0.0.1 localhost\n10.0.0.2 vm\n' >"$W/seedtree/etc/hosts"
echo vm >"$W/seedtree/etc/hostname"
"$BUILD/vmsnapd" --socket "$W/d.sock" --set "root=$W" --set "state_dir=$W/state" \
    --set "cache_dir=$W/cache" -q 2>"$W/d.log" &
DPID=$!
python3 - "$W" "$DPID" "$BUILD/vmsnap" "${REPS:-10}" "${CPU_REPS:-200}" <<'EOF'
import http.client, json, os, resource, socket, statistics, subprocess, sys, time
w, dpid, vmsnap, reps, cpu_reps = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
out, tree = os.path.join(w, "img.ext4"), os.path.join(w, "seedtree")

class UnixConn(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=60)
        self.upath = path
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.upath)

for _ in range(400):
    try:
        c = UnixConn(os.path.join(w, "d.sock")); c.connect(); break
    except OSError:
        time.sleep(0.05)
else:
    sys.exit("vmsnapd did not start: " + open(os.path.join(w, "d.log")).read()[-400:])

def req(method, path, body=None):
    c.request(method, path, body=json.dumps(body) if body is not None else None,
              headers={"Content-Type": "application/json"} if body is not None else {})
    r = c.getresponse()
    return r.status, json.loads(r.read())

def api_create():
    st, j = req("POST", "/v1/disks/create", {"path": out, "from_dir": tree})
    if st != 202:
        sys.exit("POST /v1/disks/create: %d %s" % (st, j))
    op = j["operation"]
    while op["state"] in ("queued", "running"):
        st, j = req("GET", "/v1/operations/%s?wait=10" % op["id"])
        op = j["operation"]
    if op["state"] != "done":
        sys.exit("disk.create: %s" % op)

def daemon_ns():  # CPU time of every thread of the daemon, ns
    t = 0
    for tid in os.listdir("/proc/%d/task" % dpid):
        try:
            t += int(open("/proc/%d/task/%s/schedstat" % (dpid, tid)).read().split()[0])
        except OSError:
            pass
    return t

def proc_run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if p.returncode:
        sys.exit("failed: %s: %s" % (cmd, p.stderr.decode()[-300:]))

mke2fs = ["mke2fs", "-q", "-F", "-t", "ext4", "-O", "^has_journal", "-d", tree, out, "4G"]
cli = [vmsnap, "disk", "create", "--size", "4G", "--from-dir", tree, out]
kinds = {"api": api_create, "mke2fs": lambda: proc_run(mke2fs), "cli": lambda: proc_run(cli)}
walls = {k: [] for k in kinds}
for k in kinds:  # warm each path once
    if os.path.exists(out): os.unlink(out)
    kinds[k]()
for _ in range(reps):
    for k, f in kinds.items():
        if os.path.exists(out): os.unlink(out)
        t = time.perf_counter(); f(); walls[k].append(time.perf_counter() - t)
# CPU: over more runs, the API's as the daemon's threads' time plus the client's
cpu = {}
for k, f in kinds.items():
    d0, c0, r0 = daemon_ns(), time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(cpu_reps):
        if os.path.exists(out): os.unlink(out)
        f()
    d1, c1, r1 = daemon_ns(), time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    child = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
    cpu[k] = ((d1 - d0) / 1e9 + child) / cpu_reps, (c1 - c0) / cpu_reps
m = {k: statistics.median(v) * 1000 for k, v in walls.items()}
print("disk create, seeded 4 GiB (3 files from a tree), %d rounds alternated (wall median), CPU over %d runs each"
      % (reps, cpu_reps))
print()
print("| path | wall ms (median) | wall ms (min..max) | CPU ms per create | client CPU ms | mke2fs wall / this |")
print("|---|---|---|---|---|---|")
for k, lab in [("api", "API: POST /v1/disks/create + GET ?wait= (daemon CPU)"),
               ("cli", "vmsnap disk create --from-dir (a process)"),
               ("mke2fs", "mke2fs -O ^has_journal -d (a process)")]:
    print("| %s | %.3f | %.3f..%.3f | %.3f | %s | %.1f |" % (lab, m[k], min(walls[k]) * 1000, max(walls[k]) * 1000,
          cpu[k][0] * 1000, "%.3f" % (cpu[k][1] * 1000) if k == "api" else "-", m["mke2fs"] / m[k]))
print()
print("load average at the end: %s" % " ".join(open("/proc/loadavg").read().split()[:3]))
EOF
