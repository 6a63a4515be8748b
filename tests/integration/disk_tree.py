# SPDX-License-Identifier: Apache-2.0
"""Helpers for the disk tests: make a random host tree, compare two trees.

  disk_tree.py make DIR SEED [--files N] [--deep D]
  disk_tree.py compare SRC DST [--ignore-root-times]
compare checks names, types, bytes, modes, owners, symlink targets, mtimes (ns) and that
hard-linked names in SRC are hard-linked in DST; it prints every difference and exits 1.
"""
import os
import random
import stat
import sys


def rand_name(r, maxlen=255):
    n = r.choice([1, 2, 8, 20, 64, 200, maxlen])
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-+= ~"
    s = "".join(r.choice(alphabet) for _ in range(n))
    return s if s not in (".", "..") else "x" + s


def make(root, seed, files, deep):
    r = random.Random(seed)
    os.makedirs(root, exist_ok=True)
    dirs = [root]
    d = root
    for i in range(deep):  # a deep chain
        d = os.path.join(d, "d%03d" % i)
        os.mkdir(d)
        dirs.append(d)
    regs = []
    for i in range(files):
        parent = r.choice(dirs)
        name = rand_name(r)
        p = os.path.join(parent, name)
        if os.path.lexists(p):
            continue
        kind = r.random()
        if kind < 0.15:
            os.mkdir(p, r.choice([0o755, 0o700, 0o1777, 0o2755]))
            dirs.append(p)
        elif kind < 0.25:
            tgt = "t" * r.choice([1, 30, 59, 60, 61, 200, 1000, 4000])
            os.symlink(tgt, p)
        elif kind < 0.30 and regs:
            os.link(r.choice(regs), p)
        else:
            size = r.choice([0, 1, 100, 4095, 4096, 4097, 65536, 300000, 2000000])
            with open(p, "wb") as f:
                if r.random() < 0.3 and size > 8192:
                    # sparse: data at the start, a hole, data near the end
                    f.write(os.urandom(4096))
                    f.seek(size - 5000)
                    f.write(os.urandom(5000))
                    f.truncate(size)
                else:
                    f.write(os.urandom(size))
            os.chmod(p, r.choice([0o644, 0o600, 0o755, 0o4755, 0o444]))
            regs.append(p)
        os.lchown(p, r.choice([0, 1000, 65534, 123456]), r.choice([0, 100, 65534, 654321]))
        t = r.randint(0, 2**31 - 1)
        os.utime(p, ns=(t * 10**9 + r.randint(0, 10**9 - 1), t * 10**9 + r.randint(0, 10**9 - 1)),
                 follow_symlinks=False)
    # directory times last, since adding entries changes them
    for d in reversed(dirs[1:]):
        t = r.randint(0, 2**31 - 1)
        os.utime(d, ns=(t * 10**9, t * 10**9 + 7))


def walk(root):
    out = {}
    for dp, dns, fns in os.walk(root):
        for n in dns + fns:
            p = os.path.join(dp, n)
            out[os.path.relpath(p, root)] = os.lstat(p)
    return out


def compare(src, dst, ignore_root_times):
    bad = []
    a, b = walk(src), walk(dst)
    b.pop("lost+found", None)
    for k in sorted(set(a) | set(b)):
        if k not in b:
            bad.append("missing in image: %r" % k)
            continue
        if k not in a:
            bad.append("extra in image: %r" % k)
            continue
        sa, sb = a[k], b[k]
        if stat.S_IFMT(sa.st_mode) != stat.S_IFMT(sb.st_mode):
            bad.append("%r: type differs" % k)
            continue
        if not stat.S_ISLNK(sa.st_mode) and sa.st_mode != sb.st_mode:
            bad.append("%r: mode %o vs %o" % (k, sa.st_mode, sb.st_mode))
        if (sa.st_uid, sa.st_gid) != (sb.st_uid, sb.st_gid):
            bad.append("%r: owner %d:%d vs %d:%d" % (k, sa.st_uid, sa.st_gid, sb.st_uid, sb.st_gid))
        if sa.st_mtime_ns != sb.st_mtime_ns:
            bad.append("%r: mtime %d vs %d" % (k, sa.st_mtime_ns, sb.st_mtime_ns))
        if stat.S_ISLNK(sa.st_mode):
            if os.readlink(os.path.join(src, k)) != os.readlink(os.path.join(dst, k)):
                bad.append("%r: symlink target differs" % k)
        elif stat.S_ISREG(sa.st_mode):
            if sa.st_size != sb.st_size:
                bad.append("%r: size %d vs %d" % (k, sa.st_size, sb.st_size))
            elif open(os.path.join(src, k), "rb").read() != open(os.path.join(dst, k), "rb").read():
                bad.append("%r: bytes differ" % k)
            elif sb.st_blocks > sa.st_blocks + 8 * ((sa.st_size >> 20) + 1):
                bad.append("%r: not sparse: %d blocks vs %d" % (k, sb.st_blocks, sa.st_blocks))
            if sa.st_nlink != sb.st_nlink:
                bad.append("%r: nlink %d vs %d" % (k, sa.st_nlink, sb.st_nlink))
    # hard-link groups must match
    ga, gb = {}, {}
    for k, s in a.items():
        if stat.S_ISREG(s.st_mode) and s.st_nlink > 1:
            ga.setdefault(s.st_ino, set()).add(k)
    for k, s in b.items():
        if stat.S_ISREG(s.st_mode) and s.st_nlink > 1:
            gb.setdefault(s.st_ino, set()).add(k)
    if sorted(map(sorted, ga.values())) != sorted(map(sorted, gb.values())):
        bad.append("hard-link groups differ")
    if not ignore_root_times:
        ra, rb = os.lstat(src), os.lstat(dst)
        if (ra.st_mode, ra.st_uid, ra.st_gid, ra.st_mtime_ns) != (rb.st_mode, rb.st_uid, rb.st_gid, rb.st_mtime_ns):
            bad.append("root directory attributes differ")
    for m in bad[:50]:
        print("DIFF:", m, file=sys.stderr)
    print("compared %d entries, %d differences" % (len(a), len(bad)), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1] == "make":
        args = sys.argv[2:]
        files = int(args[args.index("--files") + 1]) if "--files" in args else 300
        deep = int(args[args.index("--deep") + 1]) if "--deep" in args else 40
        make(args[0], int(args[1]), files, deep)
    elif sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3], "--ignore-root-times" in sys.argv))
    else:
        sys.exit(2)
