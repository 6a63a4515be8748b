#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Operations and admission control against a real vmsnapd (workers=1, queue_max=2) and a
store that never answers (a real TCP server on loopback that accepts and stays silent, so an
operation stays running until it is cancelled): a second operation on a busy target is 409
naming the running one; a full queue is 503 with Retry-After; a pull (priority 1) queued after
a push (priority 0) starts first; DELETE of a queued operation drops it, of a running one
cancels it as Ctrl-C does (class interrupted, nothing left at the destination); the metrics
count what was admitted and rejected; Retry-After is computed from the queue: after two
operations that each held the worker for their whole deadline (2 s: the watchdog ends them no
sooner), a full queue (one running, two queued) answers at least 2 s x 3 / 1 worker = 6 (the
configured retry_after, 2, before any history); SIGTERM then stops the daemon cleanly."""
import os, sys

sys.path.insert(0, os.path.dirname(__file__))
from dlib import Checks, Daemon, silent_store

port = silent_store()
check = Checks()
fails = check.fails

creds = None
d = None
try:
    import tempfile
    creds = tempfile.NamedTemporaryFile("w", delete=False)
    creds.write("[hang]\naws_access_key_id = AKIDTEST\naws_secret_access_key = notasecret\n")
    creds.close()
    d = Daemon("workers=1", "queue_max=2",
               f"profile=hang endpoint=http://127.0.0.1:{port} region=us-east-1 path_style",
               env={"AWS_SHARED_CREDENTIALS_FILE": creds.name, "VMSNAP_S3_ATTEMPTS": "1"})
    os.makedirs(os.path.join(d.root, "set"))
    open(os.path.join(d.root, "set", "f"), "wb").write(b"y" * 8192)
    pull = lambda dst: d.request("POST", "/v1/sets/pull",
                                 {"url": "s3://bkt/s", "path": d.root + "/" + dst, "profile": "hang"})
    st, _, a, _ = pull("p1")
    check(st == 202, f"A admitted: {st}")
    a = a["operation"]["id"]
    # wait (polled) until A runs
    while d.request("GET", f"/v1/operations/{a}")[2]["operation"]["state"] == "queued":
        pass
    st, _, b, _ = d.request("POST", "/v1/sets/push", {"path": d.root + "/set",
                                                      "url": "s3://bkt/t", "profile": "hang"})
    check(st == 202, f"B admitted: {st}")
    b = b["operation"]["id"]
    st, _, e, _ = pull("p2")
    check(st == 202, f"E admitted: {st}")
    e = e["operation"]["id"]
    st, hdr, c, _ = pull("p3")
    check(st == 503 and hdr.get("Retry-After") == "2" and c["error"]["class"] == "unreachable",
          f"a full queue: {st} {hdr.get('Retry-After')} {c}")
    st, _, dd, _ = pull("p1")
    check(st == 409 and a in dd["error"]["message"] and dd["operation"]["id"] == a and
          dd["error"]["class"] == "conflict", f"a busy target: {st} {dd}")
    st, _, r, _ = d.request("GET", "/readyz")
    check(st == 503 and r["status"] == "full", f"readyz with a full queue: {st} {r}")
    # cancel the running A: it ends as interrupted, nothing at its destination
    st, _, x, _ = d.request("DELETE", f"/v1/operations/{a}")
    check(st in (200, 202), f"DELETE A: {st}")
    oa = d.wait_op(a)
    check(oa["state"] == "cancelled" and oa["error"]["class"] == "interrupted" and
          oa["error"]["code"] == 130, f"A after its cancel: {oa['state']} {oa['error']}")
    check(not os.path.exists(d.root + "/p1"), "the cancelled pull left its destination")
    # E (a pull, priority 1) starts before B (a push, queued first)
    while d.request("GET", f"/v1/operations/{e}")[2]["operation"]["state"] == "queued":
        pass
    ob = d.request("GET", f"/v1/operations/{b}")[2]["operation"]
    check(ob["state"] == "queued", f"B started before the pull queued after it: {ob['state']}")
    st, _, x, _ = d.request("DELETE", f"/v1/operations/{b}")
    check(st == 200 and x["operation"]["state"] == "cancelled",
          f"DELETE of queued B: {st} {x['operation']['state']}")
    oe = d.request("GET", f"/v1/operations/{e}")[2]["operation"]
    check(oe["grant"]["threads"] >= 1 and oe["grant"]["memory_bytes"] >= 16 << 20,
          f"E's grant: {oe['grant']}")
    d.request("DELETE", f"/v1/operations/{e}")
    oe = d.wait_op(e)
    check(oe["state"] == "cancelled", f"E: {oe['state']}")
    m = d.request("GET", "/metrics")[3].decode()
    check("vmsnapd_operations_rejected_total 2" in m, "rejected_total is not 2")
    check("vmsnapd_operations_admitted_total 3" in m, "admitted_total is not 3")
    check('vmsnapd_operation_failures_total{class="interrupted"} 3' in m,
          "three interrupted failures not counted")
    check("notasecret" not in d.logtext(), "the secret is in the log")
    # Retry-After from the queue: two operations that run until their 2 s deadline, then a
    # full queue behind a third
    for n in ("q1", "q2"):
        st, _, o, _ = d.request("POST", "/v1/sets/pull", {"url": "s3://bkt/s", "path": d.root + "/" + n,
                                                          "profile": "hang", "deadline_seconds": 2})
        check(st == 202, f"{n} admitted: {st}")
        o = d.wait_op(o["operation"]["id"])
        check(o["state"] == "failed" and "deadline" in o["error"]["message"], f"{n}: {o}")
    ids = []
    for n in ("r1", "r2", "r3"):
        st, _, o, _ = pull(n)
        check(st == 202, f"{n} admitted: {st}")
        ids.append(o["operation"]["id"])
    st, hdr, o, _ = pull("r4")
    ra = int(hdr.get("Retry-After", "0"))
    check(st == 503 and 6 <= ra <= 3600, f"a full queue after 2 s operations: {st} Retry-After {ra}")
    st, hdr, _, _ = d.request("GET", "/readyz")
    check(st == 503 and int(hdr.get("Retry-After", "0")) >= 6,
          f"readyz's Retry-After after 2 s operations: {st} {hdr.get('Retry-After')}")
    for i in ids:
        d.request("DELETE", f"/v1/operations/{i}")
    for i in ids:
        d.wait_op(i)
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
