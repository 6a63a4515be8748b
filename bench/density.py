# SPDX-License-Identifier: Apache-2.0
"""The density benchmark's driver (bench/density.sh sets up the RGW, the tmpfs and the guest, then
runs this). N test guests booted and suspended to the RGW once (their golden sets); then per mode
("daemon": every operation through one vmsnapd; "cli": one `vmsnap` process per operation, no
daemon), U client threads cycle for DURATION seconds, each cycle the reference system's glutton:
take a free VM at random, resume it from its last set, dirty DIRTY MiB of guest RAM (the test
guest's console command "dirty N", sent with `vmsnap vm console --send` in both modes: the user's
work, not timed), suspend it to a new set (layered over the one it came from). Each mode starts
from the golden sets with an empty object cache. Times are the client's: from the request to
its answer (the daemon's include the time queued). A sampler (0.5 s) records the node's memory:
the RAM tmpfs (guest RAM and stages) + the QEMU processes' private RSS + the daemon's RSS (or
the sum of the vmsnap processes' RSS); the daemon's peak RSS (VmHWM) separately. Prints
Markdown."""
import http.client, json, os, random, socket, statistics, subprocess, sys, threading, time

E = os.environ
VMSNAP, VMSNAPD = E["VMSNAP"], E["VMSNAPD"]
W, G, BUCKET = E["W"], E["G"], E["BUCKET"]
S, RAM, SOCK = W + "/state", E["VMSNAP_RAM_DIR"], W + "/d.sock"
N, U, DUR = int(E.get("VMS", 8)), int(E.get("CLIENTS", 4)), float(E.get("DURATION", 180))
MEM_MIB, DIRTY = int(E.get("MEM_MIB", 256)), int(E.get("DIRTY_MIB", 32))
MODES = E.get("MODES", "daemon cli").split()
DAEMON_SET = E.get("DAEMON_SET", "").split()
SEED = int(E.get("SEED", 1))
log = lambda *a: print("[%s]" % time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def run(args, check=True, env=None):
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    if check and p.returncode:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(args[:4]), p.returncode, p.stderr.decode()[-400:]))
    return p


def vm(*a, **k):
    return run([VMSNAP, "vm", *a, "--state-dir", S], **k)


def con(name):
    return "%s/vms/%s/console.log" % (S, name)


def lines(name):
    try:
        with open(con(name), "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0


def wait_line(name, start, text, timeout=180):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with open(con(name), "rb") as f:
                tail = f.read().split(b"\n")[start:]
            if any(text.encode() in l for l in tail):
                return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def golden(i):
    return "s3://%s/golden/vm%d" % (BUCKET, i)


def setup():
    kernel, initrd = G + "/vmlinux", G + "/initrd.cpio.gz"
    append = open(G + "/cmdline").read().strip() + " vmsnap.dirty=16"
    for i in range(N):
        vm("run", "vm%d" % i, "--kernel", kernel, "--initrd", initrd, "--mem", "%dM" % MEM_MIB,
           "--disk-size", "%dM" % MEM_MIB, "--append", append)
        if not wait_line("vm%d" % i, 0, "vmsnap-counter ram=1 ", 300):
            raise RuntimeError("vm%d did not boot" % i)
        vm("suspend", "vm%d" % i, golden(i))
        log("vm%d booted and suspended to its golden set" % i)


class UnixConn(http.client.HTTPConnection):
    def __init__(self):
        super().__init__("localhost", timeout=700)

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(SOCK)


class DaemonClient:
    def __init__(self):
        self.c = UnixConn()

    def req(self, method, path, body=None):
        for attempt in (0, 1):  # the daemon closes a connection idle for long: open another
            try:
                self.c.request(method, path, body=json.dumps(body) if body is not None else None,
                               headers={"Content-Type": "application/json"} if body is not None else {})
                r = self.c.getresponse()
                return r.status, json.loads(r.read())
            except (OSError, http.client.HTTPException):
                self.c.close()
                self.c = UnixConn()
                if attempt:
                    raise

    def op(self, name, action, url, force=False):
        body = {"profile": "rgw"}
        if url:
            body["url"] = url
        if force:
            body["force"] = True
        st, j = self.req("POST", "/v1/vms/%s/%s" % (name, action), body)
        if st != 202:
            return False, {"error": "%d %s" % (st, j.get("error"))}
        o = j["operation"]
        while o["state"] in ("queued", "running"):
            st, j = self.req("GET", "/v1/operations/%s?wait=60" % o["id"])
            o = j["operation"]
        if o["state"] != "done":
            return False, {"error": o.get("error")}
        r = dict(o["result"])
        r["queued_s"] = (o["started"] or o["created"]) - o["created"]
        return True, r


class CliClient:
    def op(self, name, action, url, force=False):
        args = [VMSNAP, "vm", action, name] + ([url] if url else []) + ["--state-dir", S, "--json"]
        args += ["--force"] if force else []
        p = run(args, check=False)
        if p.returncode:
            return False, {"error": p.stderr.decode()[-300:]}
        return True, json.loads(p.stdout)


class Sampler(threading.Thread):
    def __init__(self, dpid):
        super().__init__(daemon=True)
        self.dpid, self.stop, self.peak, self.peak_proc, self.samples = dpid, False, 0, 0, 0
        self.busy0 = self.cpu()

    @staticmethod
    def cpu():
        v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
        return sum(v) - v[3] - v[4], sum(v)

    @staticmethod
    def status(pid):
        d = {}
        try:
            for l in open("/proc/%s/status" % pid):
                k, _, v = l.partition(":")
                if k in ("RssAnon", "RssFile", "VmHWM", "VmRSS"):
                    d[k] = int(v.split()[0]) * 1024
        except OSError:
            pass
        return d

    def ours(self):
        qemu, tools = [], []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                argv = open("/proc/%s/cmdline" % pid, "rb").read().split(b"\0")
            except OSError:
                continue
            if argv[0] == VMSNAP.encode():
                tools.append(pid)
            elif b"qemu" in argv[0] and any(S.encode() in a for a in argv):
                qemu.append(pid)
        return qemu, tools

    def run(self):
        while not self.stop:
            st = os.statvfs(RAM)
            tmpfs = (st.f_blocks - st.f_bfree) * st.f_frsize
            qemu, tools = self.ours()
            priv = lambda p: (lambda d: d.get("RssAnon", 0) + d.get("RssFile", 0))(self.status(p))
            guests = tmpfs + sum(priv(p) for p in qemu)
            proc = priv(self.dpid) if self.dpid else sum(priv(p) for p in tools)
            self.peak = max(self.peak, guests + proc)
            self.peak_proc = max(self.peak_proc, proc)
            self.samples += 1
            time.sleep(0.5)

    def busy(self):
        b1 = self.cpu()
        return (b1[0] - self.busy0[0]) / max(1, b1[1] - self.busy0[1])


def pct(v, p):
    if not v:
        return float("nan")
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def start_daemon(mode):
    args = [VMSNAPD, "--socket", SOCK, "--set", "root=" + W, "--set", "asset_dir=" + G,
            "--set", "state_dir=" + S, "--set", "ram_dir=" + RAM,
            "--set", "cache_dir=%s/cache-%s" % (W, mode),
            "--set", "profile=rgw aws=rgw endpoint=%s region=us-east-1 path_style" % E["AWS_ENDPOINT_URL"]]
    # a mode "daemon.LABEL" adds DAEMON_SET_LABEL's settings to DAEMON_SET's
    extra = E.get("DAEMON_SET_" + mode.split(".", 1)[1], "").split() if "." in mode else []
    for s in DAEMON_SET + extra:
        args += ["--set", s]
    env = {k: v for k, v in E.items() if not k.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=W + "/aws-credentials", AWS_CONFIG_FILE="/nonexistent")
    p = subprocess.Popen(args, stderr=open(W + "/vmsnapd.log", "ab"), env=env)
    open(W + "/vmsnapd.pid", "w").write(str(p.pid))
    for _ in range(600):
        if p.poll() is not None:
            raise RuntimeError("vmsnapd exited: " + open(W + "/vmsnapd.log").read()[-400:])
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(SOCK)
            s.close()
            return p
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("vmsnapd did not listen")


def metrics(name):
    st, _ = 0, None
    c = UnixConn()
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    return sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith(name + " ") or l.startswith(name + "{"))


def mode_run(mode):
    rnd = random.Random(SEED)
    E["VMSNAP_CACHE_DIR"] = "%s/cache-%s" % (W, mode)
    dproc = start_daemon(mode) if mode.split(".")[0] == "daemon" else None
    lock = threading.Lock()
    free = list(range(N))
    last = {i: golden(i) for i in range(N)}
    gen = {i: 0 for i in range(N)}
    res = {"resume": [], "suspend": [], "queued": [], "fail": [], "cycles": [], "obj": 0, "cached": 0,
           "resent": 0}
    sampler = Sampler(dproc.pid if dproc else None)
    sampler.start()
    t0 = time.monotonic()
    end = t0 + DUR

    def client(k):
        cl = DaemonClient() if dproc else CliClient()
        while time.monotonic() < end:
            with lock:
                i = free.pop(rnd.randrange(len(free)))
            name = "vm%d" % i
            try:
                a = time.monotonic()
                # the first resume of a mode goes back to the golden set: past the last mode's
                ok, r = cl.op(name, "resume", last[i], force=gen[i] == 0)
                b = time.monotonic()
                if not ok:
                    res["fail"].append(("resume", name, r["error"]))
                    time.sleep(1)
                    continue
                res["resume"].append(b - a)
                res["obj"] += r.get("object_bytes", 0)
                res["cached"] += r.get("cached_bytes", 0)
                if "queued_s" in r:
                    res["queued"].append(("resume", r["queued_s"]))
                start = lines(name)
                vm("console", name, "--send", "dirty %d" % DIRTY)
                if not wait_line(name, start, "vmsnap-dirtied", 30):
                    # a line typed while the guest's shell was not reading can be lost: once more
                    res["resent"] += 1
                    vm("console", name, "--send", "dirty %d" % DIRTY)
                    if not wait_line(name, start, "vmsnap-dirtied", 150):
                        res["fail"].append(("dirty", name, "no vmsnap-dirtied line"))
                gen[i] += 1
                url = "s3://%s/%s/vm%d/c%d" % (BUCKET, mode, i, gen[i])
                a = time.monotonic()
                ok, r = cl.op(name, "suspend", url)
                b = time.monotonic()
                if not ok:
                    res["fail"].append(("suspend", name, r["error"]))
                    last[i] = None  # the local checkpoint, if one was kept
                    time.sleep(1)
                    continue
                res["suspend"].append(b - a)
                if "queued_s" in r:
                    res["queued"].append(("suspend", r["queued_s"]))
                last[i] = url
                res["cycles"].append(b - t0)
            except Exception as ex:  # the client goes on; the VM's state as the last call left it
                res["fail"].append(("client", name, repr(ex)))
                last[i] = None
                time.sleep(1)
            finally:
                with lock:
                    free.append(i)

    ths = [threading.Thread(target=client, args=(k,)) for k in range(U)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    wall = time.monotonic() - t0
    sampler.stop = True
    sampler.join()
    res["busy"] = sampler.busy()
    res["peak"], res["peak_proc"] = sampler.peak, sampler.peak_proc
    res["wall"] = wall
    if dproc:
        res["daemon_hwm"] = Sampler.status(dproc.pid).get("VmHWM", 0)
        res["m_down"] = metrics("vmsnapd_bytes_down_total")
        res["m_hit"] = metrics("vmsnapd_cache_hit_bytes_total")
        dproc.terminate()
        dproc.wait(60)
        os.unlink(W + "/vmsnapd.pid")
    # every VM suspended at the end: a VM a failed suspend left paused or running is stopped
    for i in range(N):
        if last[i] is None:
            vm("stop", "vm%d" % i, check=False)
    for f in res["fail"][:5]:
        log("%s failure: %s" % (mode, f))
    return res


def main():
    log("booting %d VMs of %d MiB" % (N, MEM_MIB))
    setup()
    out = {}
    for mode in MODES:
        log("mode %s: %d clients over %d VMs for %.0f s" % (mode, U, N, DUR))
        out[mode] = mode_run(mode)
        log("mode %s: %d cycles, %d failures" % (mode, len(out[mode]["cycles"]), len(out[mode]["fail"])))
    json.dump(out, open(W + "/density.json", "w"))
    mib = lambda b: "%.0f" % (b / 1048576)
    rows = [("cycles completed in the window", lambda r: "%d" % sum(1 for t in r["cycles"] if t <= DUR)),
            ("throughput, cycles/min", lambda r: "%.2f" % (sum(1 for t in r["cycles"] if t <= DUR) / DUR * 60)),
            ("failures (resume, dirty, suspend)", lambda r: "%d" % len(r["fail"])),
            ("dirty commands typed again (the guest console lost the first)", lambda r: "%d" % r["resent"])]
    for op in ("resume", "suspend"):
        for p in (50, 90, 99):
            rows.append(("%s s p%d" % (op, p), lambda r, op=op, p=p: "%.2f" % pct(r[op], p)))
    for op in ("resume", "suspend"):
        rows.append(("time queued in the daemon, %s p50 / p90 s" % op, lambda r, op=op: "-" if not r["queued"] else
                     "%.2f / %.2f" % (pct([q for k, q in r["queued"] if k == op], 50), pct([q for k, q in r["queued"] if k == op], 90))))
    rows += [("node memory peak MiB (RAM tmpfs + QEMU private + daemon or CLI processes)", lambda r: mib(r["peak"])),
             ("daemon or CLI processes' memory peak MiB (sampled RSS; CLI: the sum of concurrent ones)", lambda r: mib(r["peak_proc"])),
             ("daemon peak RSS MiB (VmHWM)", lambda r: mib(r["daemon_hwm"]) if "daemon_hwm" in r else "-"),
             ("object cache hit rate (resume bytes read from the cache)", lambda r: "%.1f%%" % (100 * r["cached"] / r["obj"]) if r["obj"] else "-"),
             ("node CPU busy", lambda r: "%.0f%%" % (100 * r["busy"])),
             ("wall s (until the last cycle ended)", lambda r: "%.0f" % r["wall"])]
    print("| %d VMs of %d MiB, %d clients, %.0f s, dirty %d MiB | %s |" % (N, MEM_MIB, U, DUR, DIRTY, " | ".join(MODES)))
    print("|---|" + "---|" * len(MODES))
    for lab, f in rows:
        print("| %s | %s |" % (lab, " | ".join(f(out[m]) for m in MODES)))
    for m in (m for m in MODES if m.split(".")[0] == "daemon" and "cli" in out):
        d, c = out[m], out["cli"]
        nd, nc = sum(1 for t in d["cycles"] if t <= DUR), sum(1 for t in c["cycles"] if t <= DUR)
        print("\n%s against cli: resume p99 %.2fx lower, throughput %.2fx higher, failures %d vs %d"
              % (m, pct(c["resume"], 99) / pct(d["resume"], 99), nd / max(1, nc), len(d["fail"]), len(c["fail"])))
    print("\nload average at the end: %s" % " ".join(open("/proc/loadavg").read().split()[:3]))


main()
