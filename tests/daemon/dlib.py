# SPDX-License-Identifier: Apache-2.0
"""Helpers of the daemon tests: start a real vmsnapd on a unix socket in a temporary root, talk
HTTP to it through http.client over AF_UNIX, check bodies against docs/openapi.yaml's schemas."""
import http.client, json, os, shutil, signal, socket, subprocess, sys, tempfile, threading, time

BUILD = os.environ.get("VMSNAP_BUILD", "build")
SRC = os.environ.get("VMSNAP_SRC", ".")
DAEMON = os.path.join(BUILD, "vmsnapd")


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(1 if os.environ.get("VMSNAP_REQUIRE_ALL") == "1" else 77)


_held = []


def silent_store():
    """A store that never answers: a real TCP server on loopback that accepts every connection
    and stays silent, so an operation against it runs until it is cancelled. Returns its port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    _held.append(srv)
    threading.Thread(target=lambda: [_held.append(srv.accept()) for _ in iter(int, 1)],
                     daemon=True).start()
    return srv.getsockname()[1]


class Checks:
    """check(cond, what) prints and records a failure; .fails lists them"""

    def __init__(self):
        self.fails = []

    def __call__(self, cond, what):
        if not cond:
            print("FAIL:", what)
            self.fails.append(what)


class UnixConn(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=120)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(120)
        self.sock.connect(self.path)


class Daemon:
    def __init__(self, *settings, env=None):
        if not os.path.exists(DAEMON):
            skip(f"{DAEMON} not built (libmicrohttpd-dev, libsystemd-dev: scripts/deps.sh)")
        self.tmp = tempfile.mkdtemp(prefix="vmsnapd-")
        self.root = os.path.join(self.tmp, "root")
        self.assets = os.path.join(self.tmp, "assets")
        os.makedirs(os.path.join(self.root, "state"))
        os.makedirs(self.assets)
        self.sock = os.path.join(self.tmp, "d.sock")
        self.log = os.path.join(self.tmp, "log")
        args = [DAEMON, "--socket", self.sock, "--set", "root=" + self.root,
                "--set", "asset_dir=" + self.assets,
                "--set", "state_dir=" + os.path.join(self.root, "state"),
                "--set", "ram_dir=/dev/shm",
                "--set", "cache_dir=" + os.path.join(self.root, "cache")]
        for s in settings:
            args += ["--set", s]
        self.args = args
        self.env = dict(os.environ, **(env or {}))
        self.start()

    def start(self):
        self.proc = subprocess.Popen(self.args, stderr=open(self.log, "ab"), env=self.env)
        # ready when the socket accepts (polled; no timing in the verdict)
        for _ in range(600):
            if self.proc.poll() is not None:
                raise SystemExit(f"vmsnapd exited {self.proc.returncode}: {self.logtext()}")
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(self.sock)
                s.close()
                return
            except OSError:
                time.sleep(0.05)
        raise SystemExit("vmsnapd did not start listening")

    def logtext(self):
        return open(self.log, errors="replace").read()

    def request(self, method, path, body=None, raw=None, headers=None):
        c = UnixConn(self.sock)
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        c.request(method, path, body=data, headers=headers or {})
        r = c.getresponse()
        text = r.read()
        c.close()
        ctype = r.getheader("Content-Type") or ""
        js = json.loads(text) if ctype.startswith("application/json") else None
        return r.status, dict(r.getheaders()), js, text

    def wait_op(self, op_id):
        for _ in range(100):
            st, _, js, _ = self.request("GET", f"/v1/operations/{op_id}?wait=30")
            assert st == 200, (st, js)
            if js["operation"]["state"] not in ("queued", "running"):
                return js["operation"]
        raise AssertionError(f"operation {op_id} did not end")

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=120)
        return self.proc.returncode

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


class Schemas:
    """The subset of OpenAPI 3.0 schema objects docs/openapi.yaml uses: type, nullable, enum,
    required, properties, additionalProperties, items, $ref, allOf."""

    def __init__(self, doc):
        self.doc = doc

    def resolve(self, s):
        while "$ref" in s:
            name = s["$ref"].split("/")[-1]
            s = self.doc["components"]["schemas"][name]
        return s

    def check(self, v, s, where="$"):
        s = self.resolve(s)
        errs = []
        if v is None:
            if not s.get("nullable"):
                errs.append(f"{where}: null where not nullable")
            return errs
        for sub in s.get("allOf", []):
            errs += self.check(v, sub, where)
        t = s.get("type")
        types = {"object": dict, "array": list, "string": str, "boolean": bool}
        if t in types and not isinstance(v, types[t]):
            return errs + [f"{where}: {type(v).__name__}, not {t}"]
        if t == "integer" and (not isinstance(v, int) or isinstance(v, bool)):
            return errs + [f"{where}: {v!r} is not an integer"]
        if t == "number" and (not isinstance(v, (int, float)) or isinstance(v, bool)):
            return errs + [f"{where}: {v!r} is not a number"]
        if "enum" in s and v not in s["enum"]:
            errs.append(f"{where}: {v!r} not in {s['enum']}")
        if isinstance(v, dict):
            props = s.get("properties", {})
            for k in s.get("required", []):
                if k not in v:
                    errs.append(f"{where}: '{k}' missing")
            for k, x in v.items():
                if k in props:
                    errs += self.check(x, props[k], f"{where}.{k}")
                elif s.get("additionalProperties") is False:
                    errs.append(f"{where}: '{k}' not documented")
                elif isinstance(s.get("additionalProperties"), dict):
                    errs += self.check(x, s["additionalProperties"], f"{where}.{k}")
        if isinstance(v, list) and "items" in s:
            for i, x in enumerate(v):
                errs += self.check(x, s["items"], f"{where}[{i}]")
        return errs
