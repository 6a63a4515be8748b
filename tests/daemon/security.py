#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Every refusal of docs/daemon.md's Security section, against a real vmsnapd: paths outside
the roots (absolute, '..', a symlink escape, a dangling symlink), kernels outside the asset
directories, body and header size limits, credentials in a request (unknown fields: refused,
and never in the log), an unconfigured profile, unknown fields, a live socket not stolen and a
stale one replaced. Each refusal is checked to have done nothing."""
import os, socket, sys

sys.path.insert(0, os.path.dirname(__file__))
from dlib import Daemon

fails = []


def expect(what, got, status, cls=None):
    st, _, js, text = got
    ok = st == status and (cls is None or (js and js["error"]["class"] == cls))
    if not ok:
        print(f"FAIL: {what}: {st} {text[:300]!r}, expected {status} {cls or ''}")
        fails.append(what)


d = Daemon("body_max=4096", "header_mem=8192", "profile=node aws=nodeprofile")
try:
    out = os.path.join(d.tmp, "outside")
    os.makedirs(out)
    os.symlink(out, os.path.join(d.root, "escape"))
    os.symlink(os.path.join(out, "nothing"), os.path.join(d.root, "dangling"))
    disk = lambda p: d.request("POST", "/v1/disks/create", {"path": p})
    expect("absolute path outside", disk(os.path.join(out, "a.ext4")), 403, "access_denied")
    expect("'..' component", disk(d.root + "/../outside/b.ext4"), 403, "access_denied")
    expect("symlink escape", disk(os.path.join(d.root, "escape", "c.ext4")), 403, "access_denied")
    expect("dangling symlink", disk(os.path.join(d.root, "dangling")), 403, "access_denied")
    expect("relative path", disk("root/d.ext4"), 400, "usage")
    expect("store outside the roots",
           d.request("POST", "/v1/sets/push", {"path": d.root, "url": out + "/s"}), 403,
           "access_denied")
    expect("info outside the roots",
           d.request("GET", "/v1/disks/info?path=/etc/passwd"), 403, "access_denied")
    if os.listdir(out):
        fails.append("a refused request wrote outside the roots: %s" % os.listdir(out))
    # kernels only from the asset directories (also one reached through a symlink)
    open(os.path.join(d.root, "k"), "wb").close()
    os.symlink(os.path.join(d.root, "k"), os.path.join(d.assets, "link-out"))
    run = lambda k: d.request("POST", "/v1/vms", {"name": "v1", "kernel": k})
    expect("kernel outside the assets", run(os.path.join(d.root, "k")), 403, "access_denied")
    expect("kernel through a symlink out of the assets",
           run(os.path.join(d.assets, "link-out")), 403, "access_denied")
    expect("initrd outside the assets",
           d.request("POST", "/v1/vms", {"name": "v1", "kernel": d.assets + "/k",
                                         "initrd": "/etc/passwd"}), 403, "access_denied")
    # readiness: 1 to 256 bytes, a timeout of 1 to 3600 s and only with a line to wait for
    resume = lambda b: d.request("POST", "/v1/vms/v1/resume", b)
    expect("an empty readiness line", resume({"ready": ""}), 400, "usage")
    expect("a readiness line over 256 bytes", resume({"ready": "x" * 257}), 400, "usage")
    expect("a readiness timeout without a line", resume({"ready_timeout_seconds": 5}), 400, "usage")
    expect("a readiness timeout of 0", resume({"ready": "x", "ready_timeout_seconds": 0}), 400,
           "usage")
    expect("a run's readiness timeout over 3600 s",
           d.request("POST", "/v1/vms", {"name": "v1", "kernel": d.assets + "/k", "ready": "x",
                                         "ready_timeout_seconds": 3601}), 400, "usage")
    # size limits
    expect("body over body_max",
           d.request("POST", "/v1/disks/create", raw=b'{"path":"' + b"a" * 8000 + b'"}'), 413,
           "usage")
    st, _, _, _ = d.request("GET", "/healthz", headers={"X-Big": "b" * 16000})
    if st not in (413, 414, 431):
        print(f"FAIL: headers over header_mem: {st}")
        fails.append("header limit")
    # credentials: never accepted in a request, never logged
    secret = "SEKRITdoNotLog0123456789"
    expect("a secret key in a request",
           d.request("POST", "/v1/sets/push", {"path": d.root + "/x", "url": "s3://b/x",
                                               "aws_secret_access_key": secret}), 400, "usage")
    expect("an unconfigured profile",
           d.request("POST", "/v1/sets/push", {"path": d.root, "url": "s3://b/x",
                                               "profile": "nodeprofile"}), 403, "access_denied")
    expect("unknown field", d.request("POST", "/v1/objcache/trim", {"max_byte": 1}), 400, "usage")
    expect("wrong type", d.request("POST", "/v1/objcache/trim", {"max_bytes": "1"}), 400, "usage")
    expect("not JSON", d.request("POST", "/v1/objcache/trim", raw=b"{max_bytes: 1}"), 400, "usage")
    expect("trailing bytes", d.request("POST", "/v1/objcache/trim", raw=b"{} {}"), 400, "usage")
    expect("a VM name with a slash",
           d.request("GET", "/v1/vms/a%2Fb"), 404, "not_found")  # never split or decoded
    if secret in d.logtext():
        fails.append("the secret is in the log")
    # a live socket is not stolen; a stale one is replaced
    import subprocess
    r = subprocess.run(d.args, capture_output=True, text=True)
    if r.returncode == 0 or "another vmsnapd (pid " not in r.stderr:
        fails.append(f"a second daemon on the live socket: {r.returncode} {r.stderr}")
    st, _, _, _ = d.request("GET", "/healthz")
    if st != 200:
        fails.append("the first daemon stopped answering after the second's attempt")
    d.proc.kill()  # SIGKILL: the socket file stays, stale
    d.proc.wait()
    if not os.path.exists(d.sock):
        fails.append("no stale socket after SIGKILL (the test cannot check the replace)")
    d.start()
    expect("a stale socket replaced", d.request("GET", "/healthz"), 200)
    mode = os.stat(d.sock).st_mode & 0o777
    if mode != 0o660:
        fails.append(f"socket mode {oct(mode)}, not 0660")
    # a socket another live program listens on (a misconfigured path) is not taken from it
    d.proc.kill()
    d.proc.wait()
    os.unlink(d.sock)
    other = subprocess.Popen(["python3", "-c", "import socket, sys, time\n"
                              "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(4)\n"
                              "print('up', flush=True); time.sleep(120)", d.sock],
                             stdout=subprocess.PIPE, text=True)
    try:
        other.stdout.readline()
        r = subprocess.run(d.args, capture_output=True, text=True, timeout=60)
        if r.returncode == 0 or f"process {other.pid} (python3) is listening there" not in r.stderr:
            fails.append(f"a daemon on another program's socket: {r.returncode} {r.stderr}")
        import socket
        c = socket.socket(socket.AF_UNIX)
        try:
            c.connect(d.sock)  # still the other program's
        except OSError as e:
            fails.append(f"the other program's socket was taken: {e}")
        c.close()
    finally:
        other.kill()
        other.wait()
finally:
    if fails:
        print(d.logtext()[-3000:])
    d.cleanup()
print("fails:", fails)
sys.exit(1 if fails else 0)
