#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The node's memory budget shared live by the operations in flight (docs/daemon.md, Budgets),
against a real vmsnapd (workers=2, bulk_workers=2, memory=64M) and a store that never answers: two pushes held
running at once are each granted the whole 64 MiB as their cap (a fixed share would be 32 MiB
each) while threads and connections are still divided; a real push to a local store charges
its buffers to the shared budget (the peak gauge moves) and gives every byte back (used 0 at the
end); /metrics shows the budget."""
import os, re, sys

sys.path.insert(0, os.path.dirname(__file__))
from dlib import Checks, Daemon, silent_store

port = silent_store()
check = Checks()
fails = check.fails


def gauge(text, name):
    m = re.search(r"^%s (\d+)$" % name, text, re.M)
    return int(m.group(1)) if m else None


creds = d = None
MIB = 1 << 20
try:
    import tempfile
    creds = tempfile.NamedTemporaryFile("w", delete=False)
    creds.write("[hang]\naws_access_key_id = AKIDTEST\naws_secret_access_key = notasecret\n")
    creds.close()
    d = Daemon("workers=2", "bulk_workers=2", "memory=64M", "codec_threads=2", "connections=8",
               f"profile=hang endpoint=http://127.0.0.1:{port} region=us-east-1 path_style",
               env={"AWS_SHARED_CREDENTIALS_FILE": creds.name, "VMSNAP_S3_ATTEMPTS": "1"})
    m = d.request("GET", "/metrics")[3].decode()
    check(gauge(m, "vmsnapd_memory_budget_bytes") == 64 * MIB and
          gauge(m, "vmsnapd_memory_used_bytes") == 0, "the budget gauges at start")
    os.makedirs(os.path.join(d.root, "set"))
    open(os.path.join(d.root, "set", "f"), "wb").write(b"y" * 8192)
    ids = []
    for n in ("t1", "t2"):
        st, _, o, _ = d.request("POST", "/v1/sets/push", {"path": d.root + "/set",
                                                          "url": "s3://bkt/" + n, "profile": "hang"})
        check(st == 202, f"push {n} admitted: {st}")
        ids.append(o["operation"]["id"])
    # both run at once (polled), each capped by the whole budget, threads and connections halved
    states = lambda: [d.request("GET", f"/v1/operations/{i}")[2]["operation"] for i in ids]
    for _ in range(3000):
        ops = states()
        if all(o["state"] == "running" for o in ops):
            break
    check(all(o["state"] == "running" for o in ops), f"two pushes not running at once: {ops}")
    for o in ops:
        g = o["grant"]
        check(g["memory_bytes"] == 64 * MIB and g["threads"] == 1 and g["connections"] == 4,
              f"a grant while two run: {g}")
    for i in ids:
        d.request("DELETE", f"/v1/operations/{i}")
    for i in ids:
        check(d.wait_op(i)["state"] == "cancelled", f"{i} not cancelled")
    # a real push through the shared budget: charged, then all given back
    big = os.path.join(d.root, "big")
    os.makedirs(big)
    with open(os.path.join(big, "mem"), "wb") as f:
        f.write(os.urandom(24 * MIB))
    st, _, o, _ = d.request("POST", "/v1/sets/push", {"path": big, "url": d.root + "/store/s1"})
    check(st == 202, f"a local push admitted: {st} {o}")
    o = d.wait_op(o["operation"]["id"])
    check(o["state"] == "done" and o["grant"]["memory_bytes"] == 64 * MIB, f"the local push: {o}")
    m = d.request("GET", "/metrics")[3].decode()
    used, peak = gauge(m, "vmsnapd_memory_used_bytes"), gauge(m, "vmsnapd_memory_peak_bytes")
    check(used == 0, f"bytes left charged after every operation ended: {used}")
    check(peak is not None and peak > 0, f"the push charged nothing to the shared budget: {peak}")
    rc = d.stop()
    check(rc == 0, f"SIGTERM: exit {rc}")
finally:
    if fails and d:
        print(d.logtext()[-3000:])
    if d:
        d.cleanup()
    if creds:
        os.unlink(creds.name)
print("fails:", fails)
sys.exit(1 if fails else 0)
