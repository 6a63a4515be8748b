#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Bulk operations yield to the ones a user waits on (docs/daemon.md, Queue and workers), against
a real vmsnapd with 2 workers and a store that never answers (a real TCP server on loopback that
accepts and stays silent, so an operation runs until it is cancelled):
- with the defaults (bulk_workers = workers - 1 = 1, bulk_nice = 0), a second push stays queued
  while the first runs, and a pull (not bulk) queued after it starts at once on the other worker;
  no thread of the daemon is niced;
- with bulk_nice=10 the running push's thread runs at nice +10, the pull's and the daemon's own
  threads at its nice, and no niced thread outlives its operation;
- with bulk_workers=2 both pushes run at once.
On the code before bulk operations existed, the second push ran at once and no thread was niced."""
import os, sys, tempfile, time

sys.path.insert(0, os.path.dirname(__file__))
from dlib import Checks, Daemon, silent_store

port = silent_store()
check = Checks()
fails = check.fails


def nices(pid):
    """nice value of every thread of `pid` (field 19 of /proc/PID/task/TID/stat)"""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            s = open(f"/proc/{pid}/task/{tid}/stat").read()
        except FileNotFoundError:
            continue
        out[int(tid)] = int(s[s.rindex(")") + 2:].split()[16])
    return out


def state(d, op):
    return d.request("GET", f"/v1/operations/{op}")[2]["operation"]["state"]


def wait_running(d, op, secs=30):
    end = time.monotonic() + secs
    while time.monotonic() < end and state(d, op) == "queued":
        time.sleep(0.05)
    return state(d, op)


creds = tempfile.NamedTemporaryFile("w", delete=False)
creds.write("[hang]\naws_access_key_id = AKIDTEST\naws_secret_access_key = notasecret\n")
creds.close()


def run(*settings):
    """two pushes then a pull, all hanging on the silent store; returns what was seen"""
    d = Daemon("workers=2", "queue_max=8",
               f"profile=hang endpoint=http://127.0.0.1:{port} region=us-east-1 path_style",
               *settings,
               env={"AWS_SHARED_CREDENTIALS_FILE": creds.name, "VMSNAP_S3_ATTEMPTS": "1"})
    seen = {}
    try:
        os.makedirs(os.path.join(d.root, "set"))
        open(os.path.join(d.root, "set", "f"), "wb").write(os.urandom(1 << 20))
        base = nices(d.proc.pid)
        seen["base"] = set(base.values())
        ops = []
        for u in ("s3://bkt/a", "s3://bkt/b"):
            st, _, o, _ = d.request("POST", "/v1/sets/push",
                                    {"path": d.root + "/set", "url": u, "profile": "hang"})
            check(st == 202, f"push {u} admitted: {st}")
            ops.append(o["operation"]["id"])
        seen["push1"] = wait_running(d, ops[0])
        time.sleep(0.5)  # the second push would have started by now if it could
        seen["push2"] = state(d, ops[1])
        st, _, o, _ = d.request("POST", "/v1/sets/pull",
                                {"url": "s3://bkt/s", "path": d.root + "/p", "profile": "hang"})
        check(st == 202, f"pull admitted: {st}")
        ops.append(o["operation"]["id"])
        seen["pull"] = wait_running(d, ops[2], 5)
        time.sleep(0.3)
        seen["nices"] = nices(d.proc.pid)
        for op in ops:
            d.request("DELETE", f"/v1/operations/{op}")
        for op in ops:
            seen.setdefault("ends", []).append(d.wait_op(op)["state"])
        seen["after"] = set(nices(d.proc.pid).values())
        check(d.stop() == 0, "SIGTERM: the daemon did not exit 0")
    finally:
        if fails:
            print(d.logtext()[-3000:])
        d.cleanup()
    return seen


try:
    # the defaults: one bulk operation at a time, nothing niced
    s = run()
    print("defaults:", {k: v for k, v in s.items() if k != "nices"}, sorted(s["nices"].values()))
    check(s["push1"] == "running", f"the first push: {s['push1']}")
    check(s["push2"] == "queued", f"the second push did not wait for the first: {s['push2']}")
    check(s["pull"] == "running", f"the pull waited behind the pushes: {s['pull']}")
    check(set(s["nices"].values()) == s["base"], f"the defaults niced a thread: {s['nices']}")
    check(all(e == "cancelled" for e in s["ends"]), f"ends: {s['ends']}")
    # bulk_nice=10: the running push niced, nothing else
    s = run("bulk_nice=10")
    print("bulk_nice=10:", sorted(s["nices"].values()))
    base = min(s["base"])
    niced = [t for t, n in s["nices"].items() if n == base + 10]
    check(len(niced) >= 1, f"no thread at nice +10 while a push runs: {s['nices']}")
    check(sum(1 for n in s["nices"].values() if n == base) >= 3,
          f"the daemon's own threads (main, workers, the pull's) are not at its nice: {s['nices']}")
    check(s["after"] == {base}, f"a niced thread outlived its operation: {s['after']}")
    check(s["push2"] == "queued" and s["pull"] == "running",
          f"bulk_nice=10: the second push {s['push2']}, the pull {s['pull']}")
    # bulk_workers=2: both pushes run
    s = run("bulk_workers=2")
    print("bulk_workers=2:", s["push1"], s["push2"], s["pull"])
    check(s["push1"] == "running" and s["push2"] == "running",
          f"bulk_workers=2: the pushes {s['push1']} {s['push2']}")
    check(s["pull"] == "queued", f"bulk_workers=2: two running, the pull must wait: {s['pull']}")
finally:
    os.unlink(creds.name)
print("fails:", fails)
sys.exit(1 if fails else 0)
