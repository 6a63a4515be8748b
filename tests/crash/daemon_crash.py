#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The daemon's crash matrix: vmsnapd killed (SIGKILL) at random moments of a load of
concurrent suspend/resume cycles of 2 VMs through its API, then restarted; its start-up
recovery (daemon/recover.c, docs/daemon.md "Service life") must leave, after every kill:
  every VM running, paused or suspended (vm ls --json), a suspended one's set at its URL whole
  (it pulls, every object verified), no journal entry, no temporary in the VMs' directories, the
  RAM directory or the store, no push mark and no unfinished upload; every operation the kill
  interrupted listed as failed with class interrupted, its recovery complete ("ok").
The cycles then go on without --force. At the end: every VM resumed, its guest's RAM blob has
the md5 it booted with; a gc leaves no object that no manifest names and every set still pulls.
Prints the counts (kills, interrupted operations by kind, the VMs' status before recovery and
after); exits 1 if any kill broke the invariant.
Usage: daemon_crash.py --kills N --seed S [--vms 2] [--keep] [--verbose]
(VMSNAP_BIN, VMSNAPD_BIN; VMSNAP_GOLDEN: the vm_golden fixture's directory, whose paused guest
the VMs start from; without it they boot the test guest, guest/build.sh.)
Timings never decide pass or fail: a kill lands wherever the random delay falls."""
import argparse, contextlib, http.client, json, os, random, re, shutil, signal, socket, subprocess, sys
import tempfile, threading, time

VMSNAP = os.environ.get("VMSNAP_BIN") or sys.exit("VMSNAP_BIN is not set")
VMSNAPD = os.environ.get("VMSNAPD_BIN") or os.path.join(os.path.dirname(VMSNAP), "vmsnapd")
ap = argparse.ArgumentParser()
ap.add_argument("--kills", type=int, default=20)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--vms", type=int, default=2)
ap.add_argument("--keep", action="store_true")
ap.add_argument("--verbose", action="store_true")
args = ap.parse_args()
rng = random.Random(args.seed)
crng = random.Random(args.seed + 1)  # the clients'
if not os.access(VMSNAPD, os.X_OK):
    print(f"SKIP: {VMSNAPD} not built", file=sys.stderr)
    sys.exit(77)
if not shutil.which("qemu-system-x86_64"):
    print("SKIP: no qemu-system-x86_64", file=sys.stderr)
    sys.exit(77)
W = tempfile.mkdtemp(prefix="vmsnap-dcrash.")
RAM = tempfile.mkdtemp(prefix="vmsnap-dcrash.", dir="/dev/shm")
ROOT = os.path.join(W, "root")
STATE, STORE, SOCK = os.path.join(ROOT, "state"), os.path.join(ROOT, "store"), os.path.join(W, "d.sock")
os.makedirs(STORE)


def run(*cmd, check=True):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
    return p


class UConn(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(SOCK)


def api(method, path, body=None, timeout=60):
    """(status, answer) or (None, None) when the daemon is not there."""
    try:
        c = UConn("localhost", timeout=timeout)
        data = json.dumps(body) if body is not None else None
        c.request(method, path, data, {"Content-Type": "application/json"} if data else {})
        r = c.getresponse()
        st, txt = r.status, r.read()
        c.close()
        return st, json.loads(txt) if txt else None
    except (OSError, http.client.HTTPException, ValueError):
        return None, None


class Daemon:
    def __init__(self, guest):
        self.p, self.guest, self.log = None, guest, open(os.path.join(W, "vmsnapd.log"), "ab")

    def start(self):
        self.p = subprocess.Popen(
            [VMSNAPD, "--socket", SOCK, "--set", f"root={ROOT}", "--set", f"asset_dir={self.guest}",
             "--set", f"state_dir={STATE}", "--set", f"ram_dir={RAM}", "--set",
             f"cache_dir={os.path.join(ROOT, 'cache')}", "--set", "workers=2"],
            stdout=subprocess.DEVNULL, stderr=self.log, env=dict(os.environ, VMSNAP_FAILPOINT=""))
        for _ in range(6000):  # recovery runs before the socket serves (resumes under TCG)
            if self.p.poll() is not None:
                self.log.flush()
                tail = open(self.log.name, errors="replace").read()[-600:]
                raise RuntimeError(f"vmsnapd exited at start ({self.p.returncode}): {tail}")
            if api("GET", "/healthz", timeout=2)[0] == 200:
                return
            time.sleep(0.05)
        raise RuntimeError("vmsnapd did not come up")

    def kill(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait()

    def stop(self):
        if self.p and self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            self.p.wait()


GATE = threading.Lock()  # a client submits under it, only while HOLD is clear


def op(method, path, body=None, gated=False):
    """Submit and wait: the operation's final object, or None when the daemon went away (or,
    gated, HOLD was set: nothing submitted)."""
    with GATE if gated else contextlib.nullcontext():
        if gated and HOLD.is_set():
            return None
        st, j = api(method, path, body)
    if st != 202:
        return None if st is None else {"state": "refused", "status": st, "answer": j}
    oid = j["operation"]["id"]
    while True:
        st, j = api("GET", f"/v1/operations/{oid}?wait=30", timeout=40)
        if st != 200:
            return None
        if j["operation"]["state"] not in ("queued", "running"):
            return j["operation"]


def vm_status():
    p = run(VMSNAP, "vm", "ls", "--json", "--state-dir", STATE, check=False)
    try:
        return {v["name"]: v["status"] for v in json.loads(p.stdout)["vms"]}
    except ValueError:
        return {}


def console(name):
    try:
        return open(os.path.join(STATE, "vms", name, "console.log"), errors="replace").read()
    except FileNotFoundError:
        return ""


def wait_console(name, regex, since, secs=120):
    t = time.monotonic()
    while time.monotonic() - t < secs:
        m = re.search(regex, console(name)[since:])
        if m:
            return m
        time.sleep(0.2)
    return None


def blob_md5(name):
    for _ in range(3):  # a line can be lost on the serial console under load
        since = len(console(name))
        run(VMSNAP, "vm", "console", name, "--send", "md5", "--state-dir", STATE, check=False)
        m = wait_console(name, r"vmsnap-blob md5=([0-9a-f]+)", since, 30)
        if m:
            return m.group(1)
    return None


HOLD = threading.Event()  # set: the clients wait (a kill, a restart, the checks)
QUIT = threading.Event()
counts = {"cycles": 0, "refused": 0, "failed": 0}
clock = threading.Lock()


def client(name):
    """Cycles of resume and suspend of one VM through the API, whatever a kill did to them."""
    url = os.path.join(STORE, name)
    while not QUIT.is_set():
        if HOLD.is_set():
            time.sleep(0.1)
            continue
        st = vm_status().get(name, "none")
        if st == "running":
            time.sleep(crng.uniform(0, 1.5))  # the guest runs a while (its counters go on)
            o = op("POST", f"/v1/vms/{name}/suspend", {"url": url}, True)
        elif st == "suspended":
            o = op("POST", f"/v1/vms/{name}/resume", {"url": url}, True)
        elif st == "paused":
            o = op("POST", f"/v1/vms/{name}/resume", {}, True)
        else:  # busy (a kill's recovery runs): again later
            time.sleep(0.2)
            continue
        with clock:
            if o is None:
                pass  # the daemon went away under it
            elif o["state"] == "done":
                counts["cycles"] += 1
            elif o["state"] == "refused":
                counts["refused"] += 1
            else:
                counts["failed"] += 1
                if args.verbose:
                    print(f"  {name}: {o.get('kind')} {o['state']}: {o.get('error')}", flush=True)


def leftovers():
    """Temporaries, marks and uploads in the VMs' directories, the RAM directory, the store."""
    pat = re.compile(r"^\.[^/]*\.[A-Za-z0-9]{6}$|\.discard$|^checkpoint\.(new|old)$|^\.vmsnap-pull\.|"
                     r"^\.vmsnap-old\.|\.vmsnap-swap\.|^vmsnap-push-.*\.json$|\.mpu-")
    junk = []
    for top in (os.path.join(STATE, "vms"), RAM, STORE):
        for d, dirs, files in os.walk(top):
            junk += [os.path.join(d, n) for n in files + dirs if pat.search(n)]
    for d, _, files in os.walk(os.path.join(STATE, "vmsnapd")):
        if os.path.basename(d) == "ops":
            junk += [os.path.join(d, n) for n in files]
    return junk


def unnamed_objects():
    need, have = set(), set()
    for d, _, fs in os.walk(STORE):
        for n in fs:
            p = os.path.join(d, n)
            have.add(p.lstrip("/"))
            if n == "manifest.json":
                m = json.load(open(p))
                need.add(p.lstrip("/"))
                for f in m.get("files", {}).values():
                    for l in f.get("layers", []):
                        need.add(l["key"])
                        if "pages" in l:
                            need.add(l["pages"]["key"])
                    if "pages" in f:
                        need.add(f["pages"]["key"])
    return sorted(k for k in have - need if "/vmsnap-objects/" in "/" + k)


def set_pulls(name):
    out = os.path.join(W, "pulled")
    shutil.rmtree(out, ignore_errors=True)
    p = run(VMSNAP, "-q", "pull", os.path.join(STORE, name), out, check=False)
    return p.returncode == 0, p.stderr.strip()[-300:]


def setup(d, names):
    """The VMs running: from the golden checkpoint (resumed, suspended, the others resumed from
    its set) or booted."""
    golden = os.environ.get("VMSNAP_GOLDEN")
    md5 = None
    if golden and os.path.exists(os.path.join(golden, "golden.env")):
        env = dict(l.strip().split("=", 1) for l in open(os.path.join(golden, "golden.env")) if "=" in l)
        md5 = env["boot_md5"]
        shutil.copytree(os.path.join(golden, "state"), STATE, symlinks=True)
        d.start()
        g = os.path.join(STORE, "golden")
        for o in (op("POST", "/v1/vms/golden/resume", {}),
                  op("POST", "/v1/vms/golden/suspend", {"url": g})):
            if not o or o["state"] != "done":
                raise RuntimeError(f"setup from the golden checkpoint: {o}")
        for n in names:
            o = op("POST", f"/v1/vms/{n}/resume", {"url": g})
            if not o or o["state"] != "done":
                raise RuntimeError(f"setup of {n}: {o}")
        shutil.rmtree(os.path.join(STATE, "vms", "golden"), ignore_errors=True)
        return md5
    d.start()
    cmdline = open(os.path.join(d.guest, "cmdline")).read().strip() + " vmsnap.dirty=8"
    for n in names:
        st, j = api("POST", "/v1/vms", {"name": n, "kernel": os.path.join(d.guest, "vmlinux"),
                                        "initrd": os.path.join(d.guest, "initrd.cpio.gz"),
                                        "append": cmdline, "memory_bytes": 128 << 20})
        if st != 202:
            raise RuntimeError(f"run {n}: {st} {j}")
    for n in names:
        m = wait_console(n, r"vmsnap-ready dirty=\d+M blob=([0-9a-f]+)", 0, 300)
        if not m:
            raise RuntimeError(f"{n} did not boot")
        md5 = m.group(1)
    return md5


def main():
    g = run("bash", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "guest",
                                 "build.sh"), check=False)
    if g.returncode != 0:
        print(f"SKIP: no test guest: {g.stderr.strip()[-200:]}", file=sys.stderr)
        return 77
    d = Daemon(g.stdout.strip())
    names = [f"v{i}" for i in range(args.vms)]
    bad, kinds, before, after = [], {}, {}, {}
    try:
        md5 = setup(d, names)
        # how long one cycle takes, uninterrupted: the range the kills fall in
        t = time.monotonic()
        for n in names:
            if vm_status().get(n) != "running":
                op("POST", f"/v1/vms/{n}/resume", {})
        o1 = op("POST", f"/v1/vms/{names[0]}/suspend", {"url": os.path.join(STORE, names[0])})
        o2 = op("POST", f"/v1/vms/{names[0]}/resume", {"url": os.path.join(STORE, names[0])})
        cycle = time.monotonic() - t
        if not (o1 and o2 and o1["state"] == o2["state"] == "done"):
            raise RuntimeError(f"an uninterrupted cycle failed: {o1} {o2}")
        threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in names]
        for th in threads:
            th.start()
        for k in range(args.kills):
            # anywhere in a client's cycle: its run (up to 1.5 s), its suspend and resume
            delay = rng.uniform(0.2, (cycle + 1.5) * 1.5)
            time.sleep(delay)
            with GATE:  # no client submits from here until the checks are done
                HOLD.set()
            d.kill()
            what = f"kill {k} at {delay:.2f} s"
            d.start()  # the recovery runs before the socket serves
            # (a client that looked just before the kill may have submitted to the new daemon)
            for _ in range(600):
                st, j = api("GET", "/v1/operations")
                if st == 200 and not [o for o in j["operations"] if o["state"] in ("queued", "running")]:
                    break
                time.sleep(0.2)
            rec = [o for o in (j or {}).get("operations", []) if o["request_id"] == ""]
            for o in rec:
                kinds[o["kind"]] = kinds.get(o["kind"], 0) + 1
                r = (o.get("result") or {}).get("recovery", {})
                b, a = str(r.get("status_before")), str(r.get("status"))
                before[b] = before.get(b, 0) + 1
                after[a] = after.get(a, 0) + 1
                if o["state"] != "failed" or o["error"]["class"] != "interrupted" or not r.get("ok"):
                    bad.append(f"{what}: operation {o['id']} {o['kind']}: {o['error']['message']}")
            sts = vm_status()
            for n in names:
                s = sts.get(n, "none")
                if s not in ("running", "paused", "suspended"):
                    bad.append(f"{what}: {n} is {s} after the recovery")
                if s == "suspended":
                    ok, e = set_pulls(n)
                    if not ok:
                        bad.append(f"{what}: the set of suspended {n} does not pull: {e}")
            junk = leftovers()
            if junk:
                bad.append(f"{what}: left: {' '.join(junk[:6])}")
            if args.verbose:
                print(f"  {what}: {len(rec)} interrupted ({', '.join(o['kind'] for o in rec)}); "
                      f"VMs {sts}", flush=True)
            HOLD.clear()
        HOLD.set()
        QUIT.set()
        for th in threads:
            th.join(120)
        # every VM goes on, its blob intact; every set whole after a gc, nothing unnamed left
        for n in names:
            s = vm_status().get(n)
            if s != "running":
                url = os.path.join(STORE, n)
                o = op("POST", f"/v1/vms/{n}/resume", {"url": url} if s == "suspended" else {})
                if not o or o["state"] != "done":
                    bad.append(f"the final resume of {n} ({s}): {o and o.get('error')}")
                    continue
            got = blob_md5(n)
            if got != md5:
                bad.append(f"{n}: the guest's RAM blob md5 is {got}, not {md5}")
            o = op("POST", f"/v1/vms/{n}/suspend", {"url": os.path.join(STORE, n)})
            if not o or o["state"] != "done":
                bad.append(f"the final suspend of {n}: {o and o.get('error')}")
        p = run(VMSNAP, "-q", "gc", "--older-than", "0", STORE, check=False)
        if p.returncode != 0:
            bad.append(f"gc: {p.stderr.strip()[-300:]}")
        un = unnamed_objects()
        if un:
            bad.append(f"after gc, objects no manifest names: {' '.join(un[:5])}")
        for n in names:
            ok, e = set_pulls(n)
            if not ok:
                bad.append(f"after gc the set of {n} does not pull: {e}")
    finally:
        QUIT.set()
        HOLD.set()
        d.stop()
        for n in os.listdir(os.path.join(STATE, "vms")) if os.path.isdir(os.path.join(STATE, "vms")) else []:
            run(VMSNAP, "vm", "stop", "--rm", n, "--state-dir", STATE, "--ram-dir", RAM, check=False)
        shutil.rmtree(RAM, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(W, ignore_errors=True)

    fmt = lambda m: ", ".join(f"{v} {k}" for k, v in sorted(m.items())) or "none"
    print(f"daemon kill -9: {args.kills} kills (seed {args.seed}, {args.vms} VMs, cycle "
          f"{cycle:.1f} s): {sum(kinds.values())} operations interrupted ({fmt(kinds)}); the VMs "
          f"as recovery found them: {fmt(before)}; after it: {fmt(after)}; {counts['cycles']} "
          f"operations done, {counts['failed']} failed (not killed), {counts['refused']} refused; "
          f"{len(bad)} broke the invariant", flush=True)
    for b in bad[:20]:
        print(f"  {b}", flush=True)
    return 1 if bad else 0


sys.exit(main())
