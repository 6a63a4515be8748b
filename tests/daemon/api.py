#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""docs/openapi.yaml and the daemon agree: the route table (vmsnapd --list-routes) and the
document name the same paths and methods; every x-vmsnap-examples request is sent to a real
vmsnapd, its status must be the one given and documented, its body must match the documented
schema of that status, an error its class, and an operation's result (once it ended) the schema
the example names, or its error the class given (op_class)."""
import os, subprocess, sys
import urllib.parse

sys.path.insert(0, os.path.dirname(__file__))
from dlib import DAEMON, SRC, Daemon, Schemas, skip

try:
    import yaml
except ImportError:
    skip("python3-yaml is not installed (scripts/deps.sh)")

doc = yaml.safe_load(open(os.path.join(SRC, "docs", "openapi.yaml")))
S = Schemas(doc)
fails = []


def fail(msg):
    print("FAIL:", msg)
    fails.append(msg)


if not os.path.exists(DAEMON):
    skip("vmsnapd not built")
routes = set(tuple(l.split(" ", 1)) for l in
             subprocess.run([DAEMON, "--list-routes"], capture_output=True, text=True,
                            check=True).stdout.split("\n") if l)
documented = set((m.upper(), p) for p, ops in doc["paths"].items() for m in ops
                 if m in ("get", "post", "delete", "put"))
for r in sorted(routes - documented):
    fail(f"route {r} is not in docs/openapi.yaml")
for r in sorted(documented - routes):
    fail(f"docs/openapi.yaml documents {r}, which the daemon does not route")

d = Daemon("workers=1")
try:
    # what the examples act on: a set directory, a local store, an asset kernel file
    os.makedirs(os.path.join(d.root, "set"))
    with open(os.path.join(d.root, "set", "mem"), "wb") as f:
        f.write(os.urandom(1 << 20))
        f.seek(8 << 20)
        f.write(b"x" * 4096)
    os.makedirs(os.path.join(d.root, "store"))
    open(os.path.join(d.assets, "vmlinuz"), "wb").close()
    open(os.path.join(d.root, "vmlinuz"), "wb").close()

    def fill(s):
        if isinstance(s, str):
            return s.replace("{root}", d.root).replace("{assets}", d.assets)
        if isinstance(s, dict):
            return {k: fill(v) for k, v in s.items()}
        if isinstance(s, list):
            return [fill(v) for v in s]
        return s

    walked = 0
    for path, ops in doc["paths"].items():  # in the document's order: create before clone
        for method, op in ops.items():
            if method not in ("get", "post", "delete"):
                continue
            for ex in op.get("x-vmsnap-examples", []):
                ex = fill(ex)
                url = path
                for k, v in ex.get("params", {}).items():
                    url = url.replace("{" + k + "}", urllib.parse.quote(v, safe=""))
                if "query" in ex:
                    url += "?" + "&".join(
                        k + "=" + urllib.parse.quote(v, safe="/")
                        for k, v in (p.split("=", 1) for p in ex["query"].split("&")))
                what = f"{method.upper()} {url} {ex.get('body', '')}"
                st, hdr, js, text = d.request(method.upper(), url, body=ex.get("body"))
                walked += 1
                if not hdr.get("X-Request-Id"):
                    fail(f"{what}: no X-Request-Id")
                if st != ex["status"]:
                    fail(f"{what}: status {st}, expected {ex['status']}: {text[:300]!r}")
                    continue
                resp = op["responses"].get(str(st))
                if not resp:
                    fail(f"{what}: status {st} is not documented")
                    continue
                ctype, media = next(iter(resp["content"].items()))
                if ctype == "application/json":
                    for e in S.check(js, media["schema"]):
                        fail(f"{what}: {e}")
                    if st >= 400 and js["request_id"] != hdr.get("X-Request-Id"):
                        fail(f"{what}: request_id in the body is not the header's")
                else:
                    for t in ex.get("text", []):
                        if t.encode() not in text:
                            fail(f"{what}: '{t}' not in the text")
                if "class" in ex and (not js or js.get("error", {}).get("class") != ex["class"]):
                    fail(f"{what}: class {js and js.get('error')}, expected {ex['class']}")
                if st == 202 and ("result" in ex or "op_class" in ex):
                    o = d.wait_op(js["operation"]["id"])
                    for e in S.check(o, {"$ref": "#/components/schemas/Operation"}):
                        fail(f"{what}: operation: {e}")
                    if "result" in ex:
                        if o["state"] != "done":
                            fail(f"{what}: operation {o['state']}: {o['error']}")
                        else:
                            for e in S.check(o["result"],
                                             {"$ref": "#/components/schemas/" + ex["result"]}):
                                fail(f"{what}: result: {e}")
                    if "op_class" in ex and (o["state"] != "failed" or
                                             o["error"]["class"] != ex["op_class"]):
                        fail(f"{what}: operation {o['state']} {o['error']}, "
                             f"expected a failure of class {ex['op_class']}")
    # what the walk did is real: the pulled set's file is the pushed one
    a = open(os.path.join(d.root, "set", "mem"), "rb").read()
    b = open(os.path.join(d.root, "pulled", "mem"), "rb").read()
    if a != b:
        fail("the pulled set's file differs from the pushed one")
    rc = d.stop()
    if rc != 0:
        fail(f"vmsnapd exited {rc} on SIGTERM")
    if os.path.exists(d.sock):
        fail("the socket is left after the stop")
    print(f"{walked} requests walked over {len(documented)} routes")
finally:
    if fails:
        print(d.logtext()[-4000:])
    d.cleanup()
sys.exit(1 if fails else 0)
