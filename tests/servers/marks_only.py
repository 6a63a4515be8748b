#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A store that answers a push's marks and nothing else: a real HTTP/1.1 server on loopback
that takes PUT and DELETE of a key whose name starts with vmsnap-push- (what a suspend's test of
the store and a push's first request are) and holds every other request unanswered, so that a
suspend gets past its test of the store, stops the guest, and then hangs in its upload until it
is cancelled.

    marks_only.py PORTFILE [CODE]   (listens on an ephemeral port, writes it to PORTFILE)

With CODE (say 500), every other request is answered with that status and an S3 error body
instead of held: a store that fails every upload at once.
"""
import http.server
import os
import socketserver
import sys
import threading
import time


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        while n > 0:
            got = self.rfile.read(min(n, 1 << 16))
            if not got:
                return
            n -= len(got)

    def _answer(self, code):
        self._body()
        base = self.path.split("?", 1)[0].rsplit("/", 1)[-1]
        if not base.startswith("vmsnap-push-") and OTHERS:
            body = b"<?xml version=\"1.0\"?><Error><Code>InternalError</Code></Error>"
            self.send_response(OTHERS)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if not base.startswith("vmsnap-push-"):
            while True:  # held: the client runs until it gives up or is cancelled
                time.sleep(3600)
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.send_header("ETag", '"d41d8cd98f00b204e9800998ecf8427e"')
        self.end_headers()

    def do_PUT(self):
        self._answer(200)

    def do_DELETE(self):
        self._answer(204)

    def do_GET(self):
        self._answer(404)

    def do_HEAD(self):
        self._answer(404)

    def do_POST(self):
        self._answer(200)


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


OTHERS = int(sys.argv[2]) if len(sys.argv) > 2 else 0
srv = Server(("127.0.0.1", 0), Handler)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(srv.server_address[1]))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
threading.Thread(target=srv.serve_forever, daemon=True).start()
while True:
    time.sleep(3600)
