#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A relay in front of RGW for the s3_creds tests that logs what each request carried.

    http_tap.py --port-file F --target PORT --log F [--cert PEM --key PEM] [--token-file F]
                [--conn-log F]

Listens on an ephemeral port of 127.0.0.1 (written to --port-file), plain or, with --cert and
--key, TLS (a TLS terminator for RGW, which then sees plain HTTP). Bytes are relayed unchanged
both ways; the requests from the client are parsed only to log one line each: method, path,
User-Agent, the region of the SigV4 credential scope, and whether an x-amz-security-token came
(with --token-file: "token=ok" when it is one of that file's lines, "token=other" when not). No
key, token or signature is logged. Requests must carry Content-Length bodies (vmsnap's do).
With --conn-log, one line per client connection accepted (how many connections a client made).
"""
import argparse
import asyncio
import os
import re
import ssl


async def relay_back(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
        pass
    finally:
        writer.close()


def describe(opts, head):
    lines = head.decode("latin-1").split("\r\n")
    method, path = (lines[0].split(" ") + ["", ""])[:2]
    hdr = {}
    for ln in lines[1:]:
        if ":" in ln:
            k, v = ln.split(":", 1)
            hdr[k.strip().lower()] = v.strip()
    m = re.search(r"Credential=[^/]*/\d{8}/([^/]+)/", hdr.get("authorization", ""))
    region = m.group(1) if m else "-"
    tok = hdr.get("x-amz-security-token")
    if tok is None:
        ts = "none"
    elif opts.token_file:
        with open(opts.token_file) as f:
            ts = "ok" if tok in f.read().split() else "other"
    else:
        ts = "yes"
    ua = hdr.get("user-agent", "-")
    return (f"{method} {path.split('?')[0]} ua={ua} region={region} token={ts}\n",
            int(hdr.get("content-length", "0") or 0))


async def handle(opts, creader, cwriter):
    if opts.conn_log:
        with open(opts.conn_log, "a") as f:
            f.write("connection\n")
    try:
        ureader, uwriter = await asyncio.open_connection("127.0.0.1", opts.target)
    except OSError:
        cwriter.close()
        return
    back = asyncio.ensure_future(relay_back(ureader, cwriter))
    try:
        while True:
            head = await creader.readuntil(b"\r\n\r\n")
            line, n = describe(opts, head)
            with open(opts.log, "a") as f:
                f.write(line)
            uwriter.write(head)
            while n > 0:
                chunk = await creader.read(min(n, 65536))
                if not chunk:
                    raise ConnectionError
                uwriter.write(chunk)
                n -= len(chunk)
                await uwriter.drain()
            await uwriter.drain()
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
            ssl.SSLError):
        pass
    finally:
        uwriter.close()
        await back


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--target", type=int, required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--token-file")
    ap.add_argument("--conn-log")
    opts = ap.parse_args()
    ctx = None
    if opts.cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(opts.cert, opts.key)
    srv = await asyncio.start_server(lambda r, w: handle(opts, r, w), "127.0.0.1", 0, ssl=ctx,
                                     limit=1 << 20)
    port = srv.sockets[0].getsockname()[1]
    with open(opts.port_file + ".tmp", "w") as f:
        f.write(str(port))
    os.rename(opts.port_file + ".tmp", opts.port_file)
    async with srv:
        await srv.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
