#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The endpoints that hand out Google OAuth 2.0 access tokens, played on loopback for the
s3_creds_gcs tests.

    gcp_meta.py MODE --port-file F --tokens F --log F --ttl SECONDS [mode options]

MODE is one of
  token      Google's OAuth 2.0 token endpoint (POST /token, a form), two grants:
             urn:ietf:params:oauth:grant-type:jwt-bearer with an assertion: a JWT whose RS256
               signature must verify with --pubkey (checked by `openssl dgst -verify`, the
               public half of the key pair the test made), header alg RS256, claims iss ==
               --email, aud == this endpoint's URL, scope holding devstorage.read_write, iat
               within 5 minutes of now, exp after now and at most an hour after iat; else 400
               invalid_grant as Google answers ("Invalid JWT Signature." for a bad signature);
             refresh_token with client_id, client_secret and refresh_token equal to --client-id,
               --client-secret and the content of --refresh-token-file; else 400 invalid_grant.
  metadata   the GCE metadata server: GET
             /computeMetadata/v1/instance/service-accounts/default/token with "Metadata-Flavor:
             Google" (else 403, as GCE answers); every answer carries "Metadata-Flavor: Google"
             unless --no-flavor (a server that is not one).

A token handed out is {"access_token", "expires_in": --ttl, "token_type": "Bearer"}; every
token issued is written, with its number and its expiry (Unix seconds), to --tokens (JSON,
replaced atomically), which the GCS front door (gcs_front.py) reads to accept or refuse
requests. Each request is logged on one line to --log: method, path, status, the User-Agent,
"issued n=N" when a token was handed out, and why a request was refused. No token, key,
assertion or secret is ever logged. Listens on an ephemeral port of 127.0.0.1 (written to
--port-file) until killed.
"""
import argparse
import base64
import http.server
import json
import os
import secrets
import subprocess
import tempfile
import threading
import time
import urllib.parse

JWT_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
TOKEN_PATH = "/computeMetadata/v1/instance/service-accounts/default/token"


def b64url_decode(s):
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def rs256_ok(pubkey, signing_input, sig):
    """Does sig verify over signing_input with the RSA public key file (openssl, SHA-256)?"""
    with tempfile.TemporaryDirectory() as d:
        data, sf = os.path.join(d, "data"), os.path.join(d, "sig")
        with open(data, "wb") as f:
            f.write(signing_input)
        with open(sf, "wb") as f:
            f.write(sig)
        r = subprocess.run(["openssl", "dgst", "-sha256", "-verify", pubkey, "-signature", sf,
                            data], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return r.returncode == 0


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gcp-meta-test"

    def log_message(self, fmt, *args):  # the default logs to stderr: ours goes to --log
        pass

    def note(self, status, what=""):
        ua = self.headers.get("User-Agent", "-")
        with self.server.lock:
            with open(self.server.opts.log, "a") as f:
                f.write(f"{self.command} {self.path.split('?')[0]} {status} ua={ua}"
                        f"{' ' + what if what else ''}\n")

    def answer(self, status, body, what=""):
        data = json.dumps(body).encode() if isinstance(body, dict) else body.encode()
        self.note(status, what)  # before the answer: a client that has it finds it logged
        self.send_response(status)
        self.send_header("Content-Type",
                         "application/json" if isinstance(body, dict) else "text/plain")
        if self.server.opts.mode == "metadata" and not self.server.opts.no_flavor:
            self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def issue(self, grant):
        s = self.server
        tok = "ya29.test-" + secrets.token_urlsafe(32)
        with s.lock:
            s.count += 1
            n = s.count
            s.tokens[tok] = {"n": n, "exp": time.time() + s.opts.ttl}
            tmp = s.opts.tokens + ".tmp"
            with open(tmp, "w") as f:
                json.dump(s.tokens, f)
            os.rename(tmp, s.opts.tokens)
        self.answer(200, {"access_token": tok, "expires_in": s.opts.ttl, "token_type": "Bearer"},
                    f"issued n={n} grant={grant}")

    def refuse(self, why, desc):
        self.answer(400, {"error": "invalid_grant", "error_description": desc}, "refused=" + why)

    # ---- the metadata server
    def do_GET(self):
        o = self.server.opts
        if o.mode != "metadata":
            return self.answer(405, "")
        if self.headers.get("Metadata-Flavor") != "Google":
            return self.answer(403, "Missing Metadata-Flavor:Google header.", "refused=flavor")
        if self.path.split("?")[0] != TOKEN_PATH:
            return self.answer(404, "not found")
        self.issue("metadata")

    # ---- the token endpoint
    def jwt_check(self, assertion):
        """None if the JWT is good, else (why, Google's description)."""
        o = self.server.opts
        parts = assertion.split(".")
        if len(parts) != 3:
            return "jwt-form", "Invalid JWT: not three parts."
        try:
            hdr = json.loads(b64url_decode(parts[0]))
            claims = json.loads(b64url_decode(parts[1]))
            sig = b64url_decode(parts[2])
        except ValueError:
            return "jwt-form", "Invalid JWT: not base64url JSON."
        if hdr.get("alg") != "RS256":
            return "alg", "Invalid JWT: alg must be RS256."
        if not rs256_ok(o.pubkey, (parts[0] + "." + parts[1]).encode(), sig):
            return "signature", "Invalid JWT Signature."
        now = time.time()
        aud = f"http://127.0.0.1:{self.server.server_address[1]}/token"
        if claims.get("iss") != o.email:
            return "iss", "Invalid JWT: iss is not the service account."
        if claims.get("aud") != aud:
            return "aud", "Invalid JWT: aud is not this token endpoint."
        if SCOPE not in str(claims.get("scope", "")).split():
            return "scope", "Invalid JWT: scope lacks devstorage.read_write."
        iat, exp = claims.get("iat"), claims.get("exp")
        if not isinstance(iat, int) or not isinstance(exp, int) or abs(iat - now) > 300:
            return "iat", "Invalid JWT: Token must be a short-lived token and in a reasonable timeframe."
        if exp <= now or exp - iat > 3600:
            return "exp", "Invalid JWT: exp is past or more than an hour after iat."
        return None

    def do_POST(self):
        o = self.server.opts
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if o.mode != "token" or self.path != "/token":
            return self.answer(404, "not found")
        q = urllib.parse.parse_qs(raw.decode(), keep_blank_values=True)
        one = lambda k: q.get(k, [""])[0]  # noqa: E731
        grant = one("grant_type")
        if grant == JWT_GRANT:
            bad = self.jwt_check(one("assertion"))
            if bad:
                return self.refuse(*bad)
            return self.issue("jwt")
        if grant == "refresh_token":
            with open(o.refresh_token_file) as f:
                want = f.read().strip()
            if (one("client_id") != o.client_id or one("client_secret") != o.client_secret
                    or one("refresh_token") != want):
                return self.refuse("refresh", "Token has been expired or revoked.")
            return self.issue("refresh")
        self.answer(400, {"error": "unsupported_grant_type"}, "refused=grant")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["token", "metadata"])
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--ttl", type=int, default=3600)
    ap.add_argument("--pubkey")
    ap.add_argument("--email")
    ap.add_argument("--client-id")
    ap.add_argument("--client-secret")
    ap.add_argument("--refresh-token-file")
    ap.add_argument("--no-flavor", action="store_true")
    opts = ap.parse_args()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.opts = opts
    srv.lock = threading.Lock()
    srv.tokens = {}
    srv.count = 0
    with open(opts.port_file + ".tmp", "w") as f:
        f.write(str(srv.server_address[1]))
    os.rename(opts.port_file + ".tmp", opts.port_file)
    srv.serve_forever()


if __name__ == "__main__":
    main()
