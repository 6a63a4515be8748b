#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Crash matrix: SIGKILL each long operation at random moments, then check the invariant.

For every kill: the result is the old state or the new one, whole (never a mix, never nothing);
every later command works without --force; after a gc nothing is left that the committed state
does not need. Prints one line per operation with its counts; exits 1 if any kill broke the
invariant. Operations (--ops, comma-separated):
  push-local, push-rgw   a layered set (the default layout) pushed over another at the same URL
  pushref-local, pushref-rgw   the same in the reference layout (--layout reference)
  pull-local, pull-rgw   a set pulled over another set in the same directory
  pullmany-local         the same with sets of 2,000 small files (a long publish step)
  suspend-local, suspend-rgw   a running VM (the test guest, 128 MiB, TCG) suspended over the
                         set it came from (layered: a delta over it); after the kill the set
                         pulls whole (the old one or the new), `vm resume` (from what the node
                         has, or the URL) works without --force, the guest's blob has its md5
  resume-local, resume-rgw     a suspended VM resumed from its set, killed; then resumed again
  pause-local            a running VM paused to its local checkpoint, killed; then resumed
  For the VM operations a kill is counted by what it left (the set at the URL old or new for a
  suspend; the VM as it was, as the command leaves it, or between: frozen, interrupted, unsaved,
  ...), and every one must go on by `vm resume` alone (a frozen VM also, every other time, by a
  `vm pause` first; a VM left suspended, every other time, by `vm resume NAME URL`): a kill
  that needs --force or a `vm stop` is a failure. --focus F aims a
  share F of the kills at the VM's own windows, which uniform kills rarely hit (a suspend's
  steps from the guest's stop until its stage is complete, and its teardown; a pause's whole
  run; a resume's restore), from the steps of the uninterrupted command (`--json`).
Usage: crash.py --kills N --seed S [--ops ...] [--strict] [--focus F] [--verbose]
(VMSNAP_BIN; VMSNAP_RGW_STATE for -rgw).
A reference-layout push over a set killed between its un-commit of the old set and its commit
of the new one leaves no set at all: counted as "lost", a failure only with --strict (the layered
layout has no such window: a layered push that leaves no set is always a failure); everything
else about such a kill is checked as for the others.
Timings never decide pass or fail: a kill lands wherever the random delay falls."""
import argparse, hashlib, os, random, re, shutil, signal, subprocess, sys, tempfile, time
import urllib.parse

VMSNAP = os.environ.get("VMSNAP_BIN") or sys.exit("VMSNAP_BIN is not set")
ap = argparse.ArgumentParser()
ap.add_argument("--kills", type=int, default=50)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--ops", default="push-local,pushref-local,pull-local,push-rgw,pushref-rgw,pull-rgw")
ap.add_argument("--keep", action="store_true", help="keep the work directory")
ap.add_argument("--verbose", action="store_true", help="a line for each VM kill that went on")
ap.add_argument("--focus", type=float, default=0.0,
                help="VM ops: the share of kills aimed at the VM's own windows (a suspend's or "
                     "pause's stop-to-staged and teardown steps, a resume's restore) rather than "
                     "anywhere in the command")
ap.add_argument("--strict", action="store_true",
                help="a push over a set that leaves no set counts as a failure (see 'lost')")
args = ap.parse_args()
rng = random.Random(args.seed)
W = tempfile.mkdtemp(prefix="vmsnap-crash.", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)


def run(*cmd, env=None, check=True):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
    return p


def make_set(d, variant):
    """A VM-like set: a sparse 24 MiB memory image, a disk-like file, and small files; the two
    variants share no content, and each has one name the other lacks (so a push replaces,
    stores and drops names)."""
    os.makedirs(d)
    r = random.Random(variant * 7919 + args.seed)
    with open(os.path.join(d, "memory-ranges"), "wb") as f:
        f.truncate(24 << 20)
        for k in range(0, 24 << 20, 1 << 20):
            f.seek(k)
            f.write(r.randbytes(256 << 10))
    with open(os.path.join(d, "rootfs.img"), "wb") as f:
        f.write(r.randbytes(3 << 20))
    for name in ("state", "config.json", f"only-{variant}"):
        with open(os.path.join(d, name), "wb") as f:
            f.write(r.randbytes(r.randrange(1, 70000)))


def make_many(d, variant, n=2000):
    os.makedirs(d)
    r = random.Random(variant * 104729 + args.seed)
    for i in range(n):
        with open(os.path.join(d, f"f{i:04d}"), "wb") as f:
            f.write(r.randbytes(64))


def digest(d):
    """{visible file name: sha256} of a directory (hidden names are temporaries)."""
    out = {}
    for n in sorted(os.listdir(d)):
        if n.startswith("."):
            continue
        with open(os.path.join(d, n), "rb") as f:
            out[n] = hashlib.sha256(f.read()).hexdigest()
    return out


class Rgw:
    """Raw access to the test RGW through curl's own SigV4 signer (independent of vmsnap)."""

    def __init__(self):
        st = os.environ.get("VMSNAP_RGW_STATE")
        if not st or not os.path.exists(os.path.join(st, "env")):
            raise FileNotFoundError("no RGW (VMSNAP_RGW_STATE)")
        self.env = dict(os.environ)
        for line in open(os.path.join(st, "env")):
            m = re.match(r"(?:export )?([A-Z_0-9]+)=(.*)", line.strip())
            if m:
                self.env[m.group(1)] = m.group(2).strip("'\"")
        self.bucket = f"vmsnap-crash-{os.getpid()}-{rng.randrange(1 << 30)}"
        if self.curl("PUT", self.bucket) != "200":
            raise RuntimeError(f"cannot create bucket {self.bucket}")

    def curl(self, method, path, out="/dev/null"):
        e = self.env
        p = run("curl", "-sS", "-o", out, "-w", "%{http_code}", "--aws-sigv4", "aws:amz:us-east-1:s3",
                "--user", f"{e['AWS_ACCESS_KEY_ID']}:{e['AWS_SECRET_ACCESS_KEY']}", "-H",
                "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                "-X", method, f"{e['AWS_ENDPOINT_URL']}/{path}", check=False)
        return p.stdout

    def _xml(self, query):
        f = os.path.join(W, "list.xml")
        self.curl("GET", f"{self.bucket}/?{query}", f)
        return open(f).read()

    def keys(self, prefix):
        q = urllib.parse.quote(prefix, safe="")
        return sorted(re.findall(r"<Key>([^<]*)</Key>", self._xml(f"list-type=2&prefix={q}")))

    def uploads(self):
        return re.findall(r"<Key>([^<]*)</Key>", self._xml("uploads="))


def needed_keys(m, set_key):
    """The store keys a manifest (parsed) needs: its own and those of every object it names."""
    need = {f"{set_key}/manifest.json"}
    if m.get("formatVersion") == 3:
        for f in m["files"].values():
            need |= {l["key"] for l in f["layers"]}
            need |= {l["pages"]["key"] for l in f["layers"] if "pages" in l}
            if "pages" in f:
                need.add(f["pages"]["key"])
    else:
        need |= {f"{set_key}/{n}.zstd" for n in m.get("snapshotFiles", [])}
    return need


def store_leftovers_local(root, url_dir):
    """Names in the local store that the committed set at url_dir does not need."""
    import json
    try:
        m = json.load(open(os.path.join(url_dir, "manifest.json")))
    except FileNotFoundError:
        m = {}
    need = needed_keys(m, url_dir.lstrip("/"))
    junk = []
    for d, dirs, files in os.walk(root):
        for n in files:
            p = os.path.join(d, n)
            if not p.startswith(url_dir + "/") or p.lstrip("/") not in need:
                junk.append(os.path.relpath(p, root))
    return junk


class Counts:
    def __init__(self, op):
        self.op, self.kills, self.old, self.new, self.lost, self.bad = op, 0, 0, 0, 0, []
        self.mid, self.states = 0, {}

    def fail(self, msg):
        self.bad.append(msg)
        if args.verbose:
            print(f"  {self.op}: BROKE: {msg}", flush=True)

    def report(self):
        if self.op.split("-")[0] in ("suspend", "resume", "pause"):
            what = {"suspend": "the set at the URL", "resume": "the VM", "pause": "the VM"}
            st = ", ".join(f"{n} {s}" for s, n in sorted(self.states.items()))
            print(f"{self.op}: {self.kills} kills: {what[self.op.split('-')[0]]} old {self.old}, "
                  f"new {self.new}, between {self.mid} (status after the kill: {st}); every "
                  f"other kill went on without --force, the set whole, the RAM blob intact; "
                  f"{len(self.bad)} broke the invariant", flush=True)
            for b in self.bad[:10]:
                print(f"  {self.op}: {b}", flush=True)
            return
        s = (f"{self.op}: {self.kills} kills: {self.old} left the old state, {self.new} the new, "
             f"{self.lost} no set (the un-commit window), {len(self.bad)} broke the invariant")
        print(s, flush=True)
        for b in self.bad[:10]:
            print(f"  {self.op}: {b}", flush=True)


def kill_at(cmd, delay, env=None):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    time.sleep(delay)
    p.send_signal(signal.SIGKILL)
    p.wait()
    return p.returncode


def timed(cmd, env=None):
    t = time.monotonic()
    run(*cmd, env=env)
    return time.monotonic() - t


def push_matrix(kind, c, A, B, dA, dB, layout="layered"):
    lenv = dict(os.environ, VMSNAP_LAYOUT=layout)
    if kind == "local":
        root = os.path.join(W, "store-" + layout)
        os.makedirs(root, exist_ok=True)
        env, rgw = lenv, None
    else:
        rgw = Rgw()
        env = dict(rgw.env, VMSNAP_LAYOUT=layout)
    full = None
    for k in range(args.kills):
        if kind == "local":
            url = os.path.join(root, f"k{k}")
        else:
            url = f"s3://{rgw.bucket}/k{k}"
        run(VMSNAP, "-q", "push", A, url, env=env)
        if full is None:  # how long the same push over the same set takes, uninterrupted
            run(VMSNAP, "-q", "push", A, url + "-timing", env=env)
            full = timed([VMSNAP, "-q", "push", B, url + "-timing"], env)
        delay = rng.uniform(0, full * 1.1)
        kill_at([VMSNAP, "-q", "push", B, url], delay, env)
        c.kills += 1
        what = f"kill {k} at {delay:.3f} s of {full:.3f}"
        out = os.path.join(W, "pulled")
        shutil.rmtree(out, ignore_errors=True)
        p = run(VMSNAP, "-q", "pull", url, out, env=env, check=False)
        if p.returncode != 0:
            c.lost += 1
            if args.strict or layout == "layered":
                c.bad.append(f"{what}: no set to pull: {p.stderr.strip()[-300:]}")
        else:
            got = digest(out)
            if got == dA:
                c.old += 1
            elif got == dB:
                c.new += 1
            else:
                c.bad.append(f"{what}: the pulled set is neither the old nor the new one")
                continue
        # later commands work without --force: push again, pull, gc (no grace), and no junk
        p = run(VMSNAP, "-q", "push", B, url, env=env, check=False)
        if p.returncode != 0:
            c.bad.append(f"{what}: the next push failed: {p.stderr.strip()[-300:]}")
            continue
        shutil.rmtree(out, ignore_errors=True)
        run(VMSNAP, "-q", "pull", url, out, env=env)
        if digest(out) != dB:
            c.bad.append(f"{what}: the next push's set does not pull back")
            continue
        gc_url = root if kind == "local" else f"s3://{rgw.bucket}/k{k}"
        p = run(VMSNAP, "-q", "gc", "--older-than", "0", gc_url, env=env, check=False)
        if p.returncode != 0:
            c.bad.append(f"{what}: gc failed: {p.stderr.strip()[-300:]}")
            continue
        if kind == "local":
            junk = [j for j in store_leftovers_local(root, url)
                    if j.split("/")[0] == f"k{k}"]
        else:
            import json
            mf = os.path.join(W, "m.json")
            rgw.curl("GET", f"{rgw.bucket}/k{k}/manifest.json", mf)
            need = needed_keys(json.load(open(mf)), f"k{k}")
            junk = [x for x in rgw.keys(f"k{k}/") if x not in need]
            junk += [f"upload {u}" for u in rgw.uploads() if u.startswith(f"k{k}/")]
        if junk:
            c.bad.append(f"{what}: left after gc: {', '.join(junk[:5])}")
        # the set is still whole after the gc
        shutil.rmtree(out, ignore_errors=True)
        p = run(VMSNAP, "-q", "pull", url, out, env=env, check=False)
        if p.returncode != 0 or digest(out) != dB:
            c.bad.append(f"{what}: the set does not pull after gc")


def pull_matrix(kind, c, A, B, dA, dB):
    dB = {**dA, **dB}  # a pull replaces the set's names and keeps the directory's other files
    # (-f: a pull over files of the set's names is refused without it)
    if kind == "local":
        env = None
        base = os.path.join(W, "pstore")
        ua, ub = os.path.join(base, "a"), os.path.join(base, "b")
    else:
        rgw = Rgw()
        env = rgw.env
        ua, ub = f"s3://{rgw.bucket}/a", f"s3://{rgw.bucket}/b"
    run(VMSNAP, "-q", "push", A, ua, env=env)
    run(VMSNAP, "-q", "push", B, ub, env=env)
    full = None
    for k in range(args.kills):
        dest = os.path.join(W, f"dest{k}")
        run(VMSNAP, "-q", "pull", "-f", ua, dest, env=env)
        if full is None:  # the same pull over the same files, uninterrupted
            run(VMSNAP, "-q", "pull", "-f", ua, dest + "-timing", env=env)
            full = timed([VMSNAP, "-q", "pull", "-f", ub, dest + "-timing"], env)
        delay = rng.uniform(0, full * 1.1)
        kill_at([VMSNAP, "-q", "pull", "-f", ub, dest], delay, env)
        c.kills += 1
        what = f"kill {k} at {delay:.3f} s of {full:.3f}"
        got = digest(dest)
        if got == dA:
            c.old += 1
        elif got == dB:
            c.new += 1
        else:
            c.bad.append(f"{what}: the directory holds neither the old set nor the new one "
                         f"({sum(1 for n in got if got[n] == dA.get(n))} old files, "
                         f"{sum(1 for n in got if got[n] == dB.get(n))} new)")
            continue
        p = run(VMSNAP, "-q", "pull", "-f", ub, dest, env=env, check=False)
        if p.returncode != 0:
            c.bad.append(f"{what}: the next pull failed: {p.stderr.strip()[-300:]}")
            continue
        if digest(dest) != dB:
            c.bad.append(f"{what}: the next pull did not give the new set")
        hidden = [n for n in os.listdir(dest) if n.startswith(".")]
        if hidden:
            c.bad.append(f"{what}: left in the directory after the next pull: {', '.join(hidden[:5])}")
        shutil.rmtree(dest, ignore_errors=True)


class Vm:
    """The test guest (guest/build.sh) under one state directory, driven through the CLI."""

    def __init__(self, env):
        g = run("bash", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                     "guest", "build.sh"), check=False)
        if g.returncode != 0:
            raise FileNotFoundError(f"no test guest: {g.stderr.strip()[-200:]}")
        self.g = g.stdout.strip()
        self.state = tempfile.mkdtemp(prefix="vm-", dir=W)
        self.ram = tempfile.mkdtemp(prefix="vmram-", dir="/dev/shm")
        self.env = dict(env or os.environ, VMSNAP_RAM_DIR=self.ram, VMSNAP_ASSET_DIRS=self.g,
                        VMSNAP_CACHE_DIR=os.path.join(W, "vmcache"))

    def cmd(self, *a):
        return [VMSNAP, "vm", *a, "--state-dir", self.state]

    def vm(self, *a, check=True):
        return run(*self.cmd(*a), env=self.env, check=check)

    def console(self):
        try:
            return open(os.path.join(self.state, "vms", "v", "console.log"), errors="replace").read()
        except FileNotFoundError:
            return ""

    def wait(self, regex, since, secs=120):
        t = time.monotonic()
        while time.monotonic() - t < secs:
            m = re.search(regex, self.console()[since:])
            if m:
                return m
            time.sleep(0.2)
        raise RuntimeError(f"the guest did not print {regex!r}")

    def boot(self):
        cmdline = open(os.path.join(self.g, "cmdline")).read().strip()
        self.vm("run", "v", "--kernel", os.path.join(self.g, "vmlinux"), "--initrd",
                os.path.join(self.g, "initrd.cpio.gz"), "--mem", "128M", "--append",
                cmdline + " vmsnap.dirty=8")
        m = self.wait(r"vmsnap-ready dirty=\d+M blob=([0-9a-f]+)", 0)
        self.md5 = m.group(1)
        self.wait(r"vmsnap-counter ram=1 ", 0)

    def blob_ok(self):
        since = len(self.console())
        for _ in range(2):  # a line can be lost on the serial console under load
            self.vm("console", "v", "--send", "md5", check=False)
            try:
                return self.wait(r"vmsnap-blob md5=([0-9a-f]+)", since, 30).group(1) == self.md5
            except RuntimeError:
                continue
        return False

    def status(self):
        p = self.vm("ls", "--json", check=False)
        import json
        try:
            return {v["name"]: v["status"] for v in json.loads(p.stdout)["vms"]}.get("v", "none")
        except ValueError:
            return "unknown"

    def files(self):
        """What the VM's directories hold (for a report of a kill that broke the invariant)."""
        out = []
        for d, _, fs in os.walk(os.path.join(self.state, "vms", "v")):
            out += [os.path.relpath(os.path.join(d, f), self.state) for f in fs]
        for d, _, fs in os.walk(self.ram):
            out += [os.path.relpath(os.path.join(d, f), self.ram) for f in fs]
        return " ".join(sorted(out))

    def stop(self):
        self.vm("stop", "--rm", "v", check=False)
        shutil.rmtree(self.ram, ignore_errors=True)


def vm_matrix(op, kind, c):
    """Kill a VM operation at random moments; then the set at the URL pulls whole, the VM goes
    on without --force, its RAM blob intact."""
    env = None
    if kind == "rgw":
        rgw = Rgw()
        env = dict(rgw.env)
        url = f"s3://{rgw.bucket}/vm"
    else:
        url = os.path.join(W, "vmstore", "vm")
    v = Vm(env)
    try:
        v.boot()
        v.vm("suspend", "v", url)
        full = before = None
        pull_err = [""]

        def pulled_digest():
            """The digest of the set at the URL, pulled whole; None if it does not pull."""
            out = os.path.join(W, "vmpulled")
            shutil.rmtree(out, ignore_errors=True)
            p = run(VMSNAP, "-q", "pull", url, out, env=v.env, check=False)
            pull_err[0] = p.stderr.strip()[-300:]
            return digest(out) if p.returncode == 0 else None

        for k in range(args.kills):
            # the state before the kill: suspended at url (resume), or running (suspend, pause)
            if op != "resume":
                if v.status() != "running":
                    v.vm("resume", "v", *([] if v.status() in ("paused",) else [url]))
                v.wait(r"vmsnap-counter", len(v.console()))
            if full is None:
                # the same command uninterrupted, with its steps (--json): where the VM's own
                # windows are (its guest stopped and its state being taken or restored, its
                # local state torn down), which --focus aims at
                t = time.monotonic()
                first = {"suspend": ("suspend", "v", url), "resume": ("resume", "v", url),
                         "pause": ("pause", "v")}[op]
                p = v.vm(*first, "--json")
                full = time.monotonic() - t
                import json
                j = json.loads(p.stdout)
                start = full - j["seconds"]  # the process start, before the first step
                ends, at = {}, start
                for name, secs in j["steps"].items():
                    ends[name] = (at, at + secs)
                    at += secs
                windows = {
                    "suspend": [(start, ends.get("stage", (0, full))[1]),
                                (ends.get("upload", (0, full))[1], full)],
                    "pause": [(start, full)],
                    "resume": [(ends.get("download", (start, start))[1], full)],
                }[op]
                v.vm(*{"suspend": ("resume", "v", url), "resume": ("suspend", "v", url),
                       "pause": ("resume", "v")}[op])
            if op == "suspend" and before is None:
                before = pulled_digest()
            cmd = {"suspend": v.cmd("suspend", "v", url), "resume": v.cmd("resume", "v", url),
                   "pause": v.cmd("pause", "v")}[op]
            if args.focus and rng.random() < args.focus:
                lo, hi = rng.choice(windows)
                delay = rng.uniform(lo, hi)
            else:
                delay = rng.uniform(0, full * 1.1)
            kill_at(cmd, delay, v.env)
            c.kills += 1
            st = v.status()
            c.states[st] = c.states.get(st, 0) + 1
            what = f"kill {k} at {delay:.3f} s of {full:.3f} (status then: {st})"
            got = pulled_digest()
            if got is None:
                c.fail(f"{what}: the set at the URL does not pull: {pull_err[0]}")
                break
            if op == "suspend":  # the set at the URL: the one it replaces, or the new one
                if got == before:
                    c.old += 1
                else:
                    c.new += 1
                before = got
            else:  # the VM: as it was (running, suspended), as the command leaves it, or between
                done = {"resume": "running", "pause": "paused"}[op]
                was = {"resume": "suspended", "pause": "running"}[op]
                c.new += st == done
                c.old += st == was
                c.mid += st not in (done, was)
            # the VM goes on without --force, by the ordinary command: `vm resume` (from what the
            # node has, else from the URL); a frozen VM (a QEMU holding the stopped guest) also
            # by the pause its message used to advise, every other time
            if st == "frozen" and k % 2:
                p = v.vm("pause", "v", check=False)
                if p.returncode != 0:
                    c.fail(f"{what}: the pause of a frozen VM failed: {p.stderr.strip()[-600:]}; "
                                 f"files: {v.files()}")
            st = v.status()
            if st == "suspended" and k % 2:
                # suspended: the record names the set at the URL as the VM's newest, so a resume
                # from that URL must work too (one killed in its teardown was refused: "a
                # snapshot that its last suspend could not store")
                p = v.vm("resume", "v", url, check=False)
                if p.returncode != 0:
                    c.fail(f"{what}: 'vm resume v URL' of a suspended VM failed: "
                           f"{p.stderr.strip()[-600:]}; files: {v.files()}")
                st = v.status()
            if st != "running":
                p = v.vm("resume", "v", check=False)
                first = p.stderr.strip()[-600:]
                if p.returncode != 0:
                    p = v.vm("resume", "v", url, check=False)
                if p.returncode != 0:
                    c.fail(f"{what}: no resume without --force ({st}): 'vm resume v': {first}; "
                                 f"'vm resume v URL': {p.stderr.strip()[-1000:]}; files: {v.files()}")
                    # on past it, if --force can: the other kills are still worth checking
                    v.vm("stop", "v", check=False)
                    if (v.vm("resume", "v", "--force", check=False).returncode != 0 and
                            v.vm("resume", "v", url, "--force", check=False).returncode != 0):
                        break
                    continue
            if not v.blob_ok():
                c.fail(f"{what}: the guest's RAM blob changed (or the guest is not answering)")
                break
            if args.verbose:
                print(f"  {op}-{kind}: {what}: went on", flush=True)
            if op == "resume":  # suspended again for the next kill
                v.vm("suspend", "v", url)
        # gc leaves the set whole, and nothing no manifest names
        p = run(VMSNAP, "-q", "gc", "--older-than", "0",
                os.path.dirname(url) if kind == "local" else url, env=v.env, check=False)
        if p.returncode != 0:
            c.fail(f"gc failed: {p.stderr.strip()[-300:]}")
        if v.status() != "running":
            v.vm("resume", "v", *([] if v.status() == "paused" else [url]), check=False)
        v.vm("suspend", "v", url, check=False)
        final = os.path.join(W, f"vmfinal-{op}-{kind}")
        shutil.rmtree(final, ignore_errors=True)
        p = run(VMSNAP, "-q", "pull", url, final, env=v.env, check=False)
        if p.returncode != 0:
            c.fail(f"after gc the set does not pull: {p.stderr.strip()[-300:]}")
    finally:
        v.stop()


def main():
    A, B = os.path.join(W, "setA"), os.path.join(W, "setB")
    make_set(A, 1)
    make_set(B, 2)
    dA, dB = digest(A), digest(B)
    failed = skipped = 0
    for op in args.ops.split(","):
        what, kind = op.split("-")
        c = Counts(op)
        sets = (A, B, dA, dB)
        if what == "pullmany":
            MA, MB = os.path.join(W, "manyA"), os.path.join(W, "manyB")
            if not os.path.exists(MA):
                make_many(MA, 1)
                make_many(MB, 2)
            sets = (MA, MB, digest(MA), digest(MB))
        try:
            if what in ("suspend", "resume", "pause"):
                vm_matrix(what, kind, c)
            elif what == "pushref":
                push_matrix(kind, c, *sets, layout="reference")
            else:
                (push_matrix if what == "push" else pull_matrix)(kind, c, *sets)
        except FileNotFoundError as e:
            print(f"{op}: skipped: {e}", flush=True)
            skipped += 1
            continue
        c.report()
        failed += bool(c.bad)
    if failed:
        sys.exit(1)
    sys.exit(77 if skipped else 0)


try:
    main()
finally:  # also when an operation raised (the work directory is on tmpfs: memory)
    if not args.keep:
        shutil.rmtree(W, ignore_errors=True)
