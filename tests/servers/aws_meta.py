#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The endpoints that hand out AWS credentials, played on loopback for the s3_creds tests.

    aws_meta.py MODE --port-file F --creds F --log F [mode options]

MODE is one of
  imds       EC2 instance metadata, IMDSv2 only: PUT /latest/api/token with
             X-aws-ec2-metadata-token-ttl-seconds (1..21600) gives a session token that expires
             after that TTL; every GET needs a live token (else 401), as the real service.
             GET /latest/meta-data/iam/security-credentials/ names the role, .../ROLE gives the
             credentials as JSON.
  container  the ECS / EKS Pod Identity endpoint: GET --path with an Authorization header equal
             to --auth (or to the content of --auth-file, read at each request), else 401.
  sts        STS AssumeRoleWithWebIdentity: a form POST whose RoleArn is --role-arn and whose
             WebIdentityToken is the content of --token-file (read at each request), else an
             STS XML error; the credentials as STS's XML.

The credentials handed out are read from --creds (JSON: access_key, secret_key, token, ttl) at
each request, so a test can switch them; Expiration is now + ttl. Each request is logged on
one line to --log: method, path, status, the User-Agent, and "issued" when credentials were
handed out. No key, token or authorization value is ever logged. It listens on an ephemeral
port of 127.0.0.1 (written to --port-file) until killed.
"""
import argparse
import datetime
import http.server
import json
import os
import secrets
import threading
import time
import urllib.parse

ROLE = "vmsnap-test-role"


def load_creds(path):
    with open(path) as f:
        c = json.load(f)
    exp = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=c["ttl"])
    return c, exp.strftime("%Y-%m-%dT%H:%M:%SZ")


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "aws-meta-test"

    def log_message(self, fmt, *args):  # the default logs to stderr: ours goes to --log
        pass

    def note(self, status, issued=False):
        ua = self.headers.get("User-Agent", "-")
        with self.server.lock:
            with open(self.server.opts.log, "a") as f:
                f.write(f"{self.command} {self.path.split('?')[0]} {status} ua={ua}"
                        f"{' issued' if issued else ''}\n")

    def answer(self, status, body, ctype="text/plain", issued=False):
        data = body.encode() if isinstance(body, str) else body
        self.note(status, issued)  # before the answer: a client that has it finds it logged
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def json_creds(self, extra):
        c, exp = load_creds(self.server.opts.creds)
        d = {"AccessKeyId": c["access_key"], "SecretAccessKey": c["secret_key"],
             "Token": c["token"], "Expiration": exp}
        d.update(extra)
        self.answer(200, json.dumps(d), "application/json", issued=True)

    # ---- IMDSv2
    def imds_token_ok(self):
        t = self.headers.get("X-aws-ec2-metadata-token")
        with self.server.lock:
            exp = self.server.tokens.get(t) if t else None
        return exp is not None and time.monotonic() < exp

    def do_PUT(self):
        self.body()
        if self.server.opts.mode != "imds" or self.path != "/latest/api/token":
            return self.answer(404, "not found")
        try:
            ttl = int(self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", ""))
        except ValueError:
            ttl = 0
        if not 1 <= ttl <= 21600:
            return self.answer(400, "missing or bad X-aws-ec2-metadata-token-ttl-seconds")
        tok = secrets.token_urlsafe(32)
        with self.server.lock:
            self.server.tokens[tok] = time.monotonic() + ttl
        self.answer(200, tok)

    def do_GET(self):
        m = self.server.opts.mode
        if m == "imds":
            if not self.imds_token_ok():
                return self.answer(401, "")
            base = "/latest/meta-data/iam/security-credentials/"
            if self.path == base:
                return self.answer(200, ROLE)
            if self.path == base + ROLE:
                return self.json_creds({"Code": "Success", "Type": "AWS-HMAC",
                                        "LastUpdated": "2026-01-01T00:00:00Z"})
            return self.answer(404, "not found")
        if m == "container":
            o = self.server.opts
            want = o.auth
            if o.auth_file:
                with open(o.auth_file) as f:
                    want = f.read().strip()
            if want is not None and self.headers.get("Authorization") != want:
                return self.answer(401, json.dumps({"message": "bad authorization"}),
                                   "application/json")
            if self.path != o.path:
                return self.answer(404, "not found")
            return self.json_creds({"RoleArn": "arn:aws:iam::123456789012:role/" + ROLE})
        return self.answer(405, "")

    # ---- STS
    def sts_error(self, status, code, msg):
        x = (f'<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error>'
             f"<Type>Sender</Type><Code>{code}</Code><Message>{msg}</Message></Error>"
             f"<RequestId>test</RequestId></ErrorResponse>")
        self.answer(status, x, "text/xml")

    def do_POST(self):
        o = self.server.opts
        raw = self.body()
        if o.mode != "sts":
            return self.answer(405, "")
        q = urllib.parse.parse_qs(raw.decode(), keep_blank_values=True)
        one = lambda k: q.get(k, [""])[0]  # noqa: E731
        if one("Action") != "AssumeRoleWithWebIdentity" or one("Version") != "2011-06-15":
            return self.sts_error(400, "InvalidAction", "not AssumeRoleWithWebIdentity")
        with open(o.token_file) as f:
            want = f.read().strip()
        if one("WebIdentityToken") != want:
            return self.sts_error(400, "InvalidIdentityToken", "the token is not the one issued")
        if one("RoleArn") != o.role_arn:
            return self.sts_error(403, "AccessDenied", "not authorized to assume this role")
        if not one("RoleSessionName"):
            return self.sts_error(400, "ValidationError", "RoleSessionName missing")
        c, exp = load_creds(o.creds)
        x = ('<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
             "<AssumeRoleWithWebIdentityResult><Credentials>"
             f"<SessionToken>{c['token']}</SessionToken>"
             f"<SecretAccessKey>{c['secret_key']}</SecretAccessKey>"
             f"<Expiration>{exp}</Expiration>"
             f"<AccessKeyId>{c['access_key']}</AccessKeyId></Credentials>"
             f"<SubjectFromWebIdentityToken>system:serviceaccount:test</SubjectFromWebIdentityToken>"
             "</AssumeRoleWithWebIdentityResult><ResponseMetadata><RequestId>test</RequestId>"
             "</ResponseMetadata></AssumeRoleWithWebIdentityResponse>")
        self.answer(200, x, "text/xml", issued=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["imds", "container", "sts"])
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--creds", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--path", default="/creds")
    ap.add_argument("--auth")
    ap.add_argument("--auth-file")
    ap.add_argument("--token-file")
    ap.add_argument("--role-arn")
    opts = ap.parse_args()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.opts = opts
    srv.lock = threading.Lock()
    srv.tokens = {}
    with open(opts.port_file + ".tmp", "w") as f:
        f.write(str(srv.server_address[1]))
    os.rename(opts.port_file + ".tmp", opts.port_file)
    srv.serve_forever()


if __name__ == "__main__":
    main()
