#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The front door of Cloud Storage's XML API with OAuth 2.0, played on loopback in front of the
real RGW for the s3_creds_gcs tests (RGW does not take Google's bearer tokens).

    gcs_front.py --port-file F --rgw URL --tokens F [--tokens F...] --log F [--delay-ms N]

The RGW keys to sign with come from the environment (GCS_FRONT_AK, GCS_FRONT_SK), never the
command line. A request is accepted only as Cloud Storage would take it with OAuth:
"Authorization: Bearer TOKEN" where TOKEN is one a token server (gcp_meta.py) issued, as its
--tokens file says (re-read at every request), and not expired; anything else is answered 401
with an XML error (AuthenticationRequired), as GCS does. A request that also carries AWS signing
headers (x-amz-date, x-amz-content-sha256, x-amz-security-token) is refused with 400. An accepted
request is sent on to RGW with its method, path, query, body, Range and Content-Type, its
x-goog-* headers under their x-amz-* names, and signed there with AWS Signature V4 (an
UNSIGNED-PAYLOAD body) with the RGW keys; RGW's answer is relayed back.

--delay-ms holds every request with a body of 1 MiB or more (an upload's part) that long before
it goes on: a push then lasts long enough to outlive a short-lived token.

Each request is logged on one line to --log: method, path, status, "tok=N" (the number of the
token it carried, or "tok=-"), "late" when the first token issued had already expired, and
"refused=WHY" when it was refused. No token or key is ever logged.
"""
import argparse
import datetime
import hashlib
import hmac
import http.client
import http.server
import json
import os
import threading
import time
import urllib.parse

REGION = "us-east-1"
AWS_SIGNING = ("x-amz-date", "x-amz-content-sha256", "x-amz-security-token")


def sigv4_headers(method, host, path, query, amz_headers, ak, sk):
    """The headers that sign a request to RGW (Signature V4, UNSIGNED-PAYLOAD)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    h = {"host": host, "x-amz-content-sha256": "UNSIGNED-PAYLOAD", "x-amz-date": amz_date}
    h.update({k: v.strip() for k, v in amz_headers.items()})
    names = sorted(h)
    # the query as the client encoded it (vmsnap sends it SigV4-encoded), pairs sorted
    pairs = sorted(tuple((p.split("=", 1) + [""])[:2]) for p in query.split("&") if p)
    canon = "\n".join([method, path, "&".join(f"{k}={v}" for k, v in pairs),
                       "".join(f"{n}:{h[n]}\n" for n in names), ";".join(names),
                       "UNSIGNED-PAYLOAD"])
    scope = f"{day}/{REGION}/s3/aws4_request"
    sts = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                     hashlib.sha256(canon.encode()).hexdigest()])
    k = ("AWS4" + sk).encode()
    for part in (day, REGION, "s3", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    sig = hmac.new(k, sts.encode(), hashlib.sha256).hexdigest()
    h["authorization"] = (f"AWS4-HMAC-SHA256 Credential={ak}/{scope}, "
                          f"SignedHeaders={';'.join(names)}, Signature={sig}")
    del h["host"]
    return h


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gcs-front-test"

    def log_message(self, fmt, *args):
        pass

    def note(self, status, tok, extra=""):
        s = self.server
        late = s.first_exp is not None and time.time() > s.first_exp
        with s.lock:
            with open(s.opts.log, "a") as f:
                f.write(f"{self.command} {self.path.split('?')[0]} {status} tok={tok}"
                        f"{' late' if late else ''}{' ' + extra if extra else ''}\n")

    def tokens(self):
        t = {}
        for path in self.server.opts.tokens:
            try:
                with open(path) as f:
                    t.update(json.load(f))
            except (OSError, ValueError):
                pass
        firsts = [v["exp"] for v in t.values() if v["n"] == 1]
        if firsts and self.server.first_exp is None:
            self.server.first_exp = min(firsts)
        return t

    def refuse(self, status, code, msg, why):
        body = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
                f"<Message>{msg}</Message></Error>").encode()
        self.note(status, "-", "refused=" + why)
        self.send_response(status)
        self.send_header("Content-Type", "application/xml; charset=UTF-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def handle_any(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        auth = self.headers.get("Authorization", "")
        if any(self.headers.get(h) is not None for h in AWS_SIGNING):
            return self.refuse(400, "InvalidArgument", "AWS signing headers with a bearer token",
                               "sigv4-headers")
        if not auth.startswith("Bearer "):
            return self.refuse(401, "AuthenticationRequired", "Authentication required.",
                               "no-bearer")
        t = self.tokens().get(auth[7:])
        if t is None:
            return self.refuse(401, "AuthenticationRequired", "Invalid Credentials", "unknown")
        if time.time() >= t["exp"]:
            return self.refuse(401, "AuthenticationRequired", "Invalid Credentials", "expired")
        if len(body) >= (1 << 20) and self.server.opts.delay_ms:
            time.sleep(self.server.opts.delay_ms / 1000)
        self.forward(body, t["n"])

    def forward(self, body, tok_n):
        o = self.server.opts
        u = urllib.parse.urlsplit(o.rgw)
        path, _, query = self.path.partition("?")
        amz = {"x-amz-" + k[7:].lower(): v for k, v in self.headers.items()
               if k.lower().startswith("x-goog-")}
        hdr = sigv4_headers(self.command, u.netloc, path, query, amz, os.environ["GCS_FRONT_AK"],
                            os.environ["GCS_FRONT_SK"])
        for k in ("Range", "Content-Type"):
            if self.headers.get(k):
                hdr[k] = self.headers[k]
        hdr["Content-Length"] = str(len(body))
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
        try:
            conn.request(self.command, self.path, body=body, headers=hdr)
            r = conn.getresponse()
            data = r.read()
            rh = r.getheaders()
            status = r.status
        finally:
            conn.close()
        self.note(status, tok_n)
        self.send_response(status)
        for k, v in rh:
            if k.lower() not in ("connection", "transfer-encoding", "content-length", "server",
                                 "date", "keep-alive"):
                self.send_header(k, v)
        clen = dict((k.lower(), v) for k, v in rh).get("content-length")
        self.send_header("Content-Length",
                         clen if self.command == "HEAD" and clen else str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_any


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--rgw", required=True)
    ap.add_argument("--tokens", action="append", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--delay-ms", type=int, default=0)
    opts = ap.parse_args()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.opts = opts
    srv.lock = threading.Lock()
    srv.first_exp = None
    with open(opts.port_file + ".tmp", "w") as f:
        f.write(str(srv.server_address[1]))
    os.rename(opts.port_file + ".tmp", opts.port_file)
    srv.serve_forever()


if __name__ == "__main__":
    main()
