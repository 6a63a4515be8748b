#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Crash matrix: SIGKILL each long operation at random moments, then check the invariant.

For every kill: the result is the old state or the new one, whole (never a mix, never nothing);
every later command works without --force; after a gc nothing is left that the committed state
does not need. Prints one line per operation with its counts; exits 1 if any kill broke the
invariant. Operations (--ops, comma-separated):
  push-local, push-rgw   a set pushed over another set at the same URL
  pull-local, pull-rgw   a set pulled over another set in the same directory
  pullmany-local         the same with sets of 2,000 small files (a long publish step)
Usage: crash.py --kills N --seed S [--ops ...] [--strict] (VMSNAP_BIN; VMSNAP_RGW_STATE for -rgw).
A push over a set killed between its un-commit of the old set and its commit of the new one
leaves no set at all: counted as "lost" (issue #23, immutable objects, removes that window), a
failure only with --strict; everything else about such a kill is checked as for the others.
Timings never decide pass or fail: a kill lands wherever the random delay falls."""
import argparse, hashlib, os, random, re, shutil, signal, subprocess, sys, tempfile, time
import urllib.parse

VMSNAP = os.environ.get("VMSNAP_BIN") or sys.exit("VMSNAP_BIN is not set")
ap = argparse.ArgumentParser()
ap.add_argument("--kills", type=int, default=50)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--ops", default="push-local,pull-local,push-rgw,pull-rgw")
ap.add_argument("--keep", action="store_true", help="keep the work directory")
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


def store_leftovers_local(root, url_dir):
    """Names in the local store that the committed set at url_dir does not need."""
    need = {"manifest.json"} | {n + ".zstd" for n in manifest_files_local(url_dir)}
    junk = []
    for d, dirs, files in os.walk(root):
        for n in files:
            p = os.path.join(d, n)
            if os.path.dirname(p) != url_dir or n not in need:
                junk.append(os.path.relpath(p, root))
    return junk


def manifest_files_local(url_dir):
    import json
    try:
        m = json.load(open(os.path.join(url_dir, "manifest.json")))
    except FileNotFoundError:
        return []
    files = m.get("files") or m.get("snapshotFiles") or []
    return [f["name"] if isinstance(f, dict) else f for f in files]


class Counts:
    def __init__(self, op):
        self.op, self.kills, self.old, self.new, self.lost, self.bad = op, 0, 0, 0, 0, []

    def report(self):
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


def push_matrix(kind, c, A, B, dA, dB):
    if kind == "local":
        root = os.path.join(W, "store")
        os.makedirs(root, exist_ok=True)
        env, rgw = None, None
    else:
        rgw = Rgw()
        env = rgw.env
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
            if args.strict:
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
                    if not re.match(r"k\d+(-timing)?/", j) or j.split("/")[0] == f"k{k}"]
        else:
            need = {f"k{k}/manifest.json"} | {f"k{k}/{n}.zstd" for n in dB}
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
