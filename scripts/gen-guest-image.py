#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Make a guest-memory-like sparse image: SIZE logical bytes of which about FRACTION is
allocated, in page-aligned runs of text, ELF binaries from /usr, random bytes and explicitly
written zero pages (as a guest kernel leaves freed memory), with holes between.
Deterministic for a given seed.  usage: gen-guest-image.py PATH [SIZE_MIB] [FRACTION] [SEED]"""
import os
import random
import sys

PAGE = 4096
REGION = 2 << 20  # decisions per 2 MiB region


def corpus(rng, paths, limit):
    out = bytearray()
    for p in paths:
        try:
            with open(p, "rb") as f:
                out += f.read(limit - len(out))
        except OSError:
            continue
        if len(out) >= limit:
            break
    return bytes(out)


def main():
    path = sys.argv[1]
    size = int(sys.argv[2]) << 20 if len(sys.argv) > 2 else 2 << 30
    frac = float(sys.argv[3]) if len(sys.argv) > 3 else 0.25
    rng = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else 1)
    elves = sorted(os.path.join("/usr/bin", n) for n in os.listdir("/usr/bin"))
    rng.shuffle(elves)
    elf = corpus(rng, [p for p in elves if os.path.isfile(p)], 48 << 20)
    texts = []
    for root in ("/usr/share/common-licenses", "/usr/share/doc", "/usr/include"):
        for dp, _, fns in os.walk(root):
            for fn in fns:
                if not fn.endswith((".gz", ".xz", ".bz2")):
                    texts.append(os.path.join(dp, fn))
    texts.sort()
    rng.shuffle(texts)
    text = corpus(rng, texts, 24 << 20)
    rand = rng.randbytes(16 << 20)
    zero = bytes(REGION)
    with open(path, "wb") as f:
        f.truncate(size)
        for base in range(0, size, REGION):
            if rng.random() >= frac:
                continue
            pos = base
            end = min(base + REGION, size)
            while pos < end:
                n = min(PAGE * rng.randint(1, 64), end - pos)
                k = rng.random()
                if k < 0.35:
                    src = text
                elif k < 0.70:
                    src = elf
                elif k < 0.85:
                    src = rand
                else:
                    src = None
                if src is None:
                    chunk = zero[:n]
                else:
                    o = rng.randrange(0, len(src) - n) & ~(PAGE - 1)
                    chunk = src[o:o + n]
                f.seek(pos)
                f.write(chunk)
                pos += n


if __name__ == "__main__":
    main()
