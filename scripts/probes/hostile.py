#!/usr/bin/env python3
"""Hostile clients against a running binary on loopback, as RELIABILITY.md's probes were made.

    python3 scripts/probes/hostile.py target/release/inflight [--only NAME]

Each probe starts its own `inflight serve` or `inflight proxy` (and a tiny upstream) on free ports,
attacks it for a bounded time, prints one JSON line of figures, and stops what it started:

- slow-bodies: 174 request bodies to `serve` (and 200 through the proxy) trickled in at one byte
  every 5 s for 45 s, while a fresh client acquires and releases every 2 s.
- idle-flood: `serve` under a limit of 256 open files, 300 idle sockets kept open (reopened when
  closed) for 40 s, while `/healthz` is asked every 2 s.
- status-watchers: 32 `/status/events` watchers that read nothing, then a 33rd tried every second.
- transfer-coding: `Transfer-Encoding: gzip, chunked` to `serve` and through the proxy.
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import json
import resource
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable

HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One inflight process on a free port; `wrap` runs it under a shell prefix (e.g. a ulimit)."""

    def __init__(self, binary: str, args: list[str], wrap: str = "") -> None:
        self.port, self.admin = free_port(), free_port()
        argv = [binary, *args, "--listen", f"127.0.0.1:{self.port}"]
        if args[0] == "proxy":
            argv += ["--admin-listen", f"127.0.0.1:{self.admin}"]
        if wrap:
            argv = ["sh", "-c", f'{wrap} && exec "$0" "$@"', *argv]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{argv} did not start")

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


class Upstream:
    """An upstream that answers every request with 200 after reading its body."""

    def __init__(self) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *_: object) -> None:
                pass

        class Quiet(http.server.ThreadingHTTPServer):
            def handle_error(self, *_: object) -> None:
                pass  # a client the proxy cut

        self.server = Quiet(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()


def serve_and_proxy(binary: str) -> tuple[Upstream, Server, Server]:
    """An upstream, a `serve`, and a proxy to the upstream keyed by `X-Tenant` (limit 1,000 a key)."""
    upstream = Upstream()
    serve = Server(binary, ["serve"])
    proxy = Server(
        binary,
        ["proxy", "--upstream", upstream.base, "--key", "{header:x-tenant}", "--default-limit", "1000"],
    )
    return upstream, serve, proxy


async def exchange(port: int, request: bytes, wait: float = 5.0) -> str | None:
    """The status line of the answer to `request`, or None when none came within `wait`."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), wait)
    except (OSError, asyncio.TimeoutError):
        return None
    try:
        writer.write(request)
        line = await asyncio.wait_for(reader.readline(), wait)
        return line.decode(errors="replace").strip() or None
    except (OSError, asyncio.TimeoutError):
        return None
    finally:
        writer.close()


async def trickler(port: int, head: bytes, every: float, until: float) -> float | None:
    """Sends `head` and then a byte every `every` s until the server answers or closes (the time it
    took, in s) or `until` passes (None: never cut)."""
    started = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return 0.0
    try:
        writer.write(head)
        while time.monotonic() < until:
            try:
                got = await asyncio.wait_for(reader.read(1), every)
                if got or reader.at_eof():
                    return time.monotonic() - started
            except asyncio.TimeoutError:
                writer.write(b"x")
                await writer.drain()
        return None
    except OSError:
        return time.monotonic() - started
    finally:
        writer.close()


def permits_held(listing: str) -> int:
    """The permits in flight over every key of a `/v1/keys` listing."""
    with urllib.request.urlopen(listing, timeout=5) as answer:
        return sum(int(key["in_flight"]) for key in json.load(answer)["keys"])


async def every(period: float, until: float, probe: Callable[[], Awaitable[bool]]) -> list[bool]:
    """`probe` run every `period` s until `until`: its outcomes."""
    outcomes = []
    while time.monotonic() < until:
        started = time.monotonic()
        outcomes.append(await probe())
        await asyncio.sleep(max(0.0, period - (time.monotonic() - started)))
    return outcomes


async def slow_bodies(binary: str) -> dict[str, object]:
    upstream, serve, proxy = serve_and_proxy(binary)
    try:
        until = time.monotonic() + 45
        body = b'{"lease_ms": 5000}'

        async def fresh() -> bool:
            head = b"POST /v1/keys/fresh/permits HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            status = await exchange(serve.port, head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            return status is not None and status.startswith("HTTP/1.1 201")

        api_head = b"POST /v1/keys/slow/permits HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
        proxied = b"POST /upload HTTP/1.1\r\nHost: x\r\nX-Tenant: t%d\r\nContent-Length: 1000\r\n\r\n"
        slow = [trickler(serve.port, api_head, 5, until) for _ in range(174)]
        slow += [trickler(proxy.port, proxied % i, 5, until) for i in range(200)]
        cut, fresh_ok = await asyncio.gather(asyncio.gather(*slow), every(2, until, fresh))
        api_cut, proxy_cut = cut[:174], cut[174:]
        listing = f"http://127.0.0.1:{proxy.admin}/v1/keys?limit=1000"
        held = await asyncio.to_thread(permits_held, listing)
        return {
            "probe": "slow-bodies",
            "fresh_acquisitions_ok": f"{sum(fresh_ok)} of {len(fresh_ok)}",
            "serve_bodies_cut": f"{sum(c is not None for c in api_cut)} of 174",
            "serve_cut_after_s_max": max((c for c in api_cut if c is not None), default=None),
            "proxy_bodies_cut": f"{sum(c is not None for c in proxy_cut)} of 200",
            "proxy_cut_after_s_max": max((c for c in proxy_cut if c is not None), default=None),
            "proxy_permits_held_after": held,
        }
    finally:
        serve.stop()
        proxy.stop()
        upstream.stop()


async def idle_flood(binary: str) -> dict[str, object]:
    serve = Server(binary, ["serve", "--workers", "1"], wrap="ulimit -n 256")
    try:
        until = time.monotonic() + 40

        async def hold() -> None:
            while time.monotonic() < until:
                try:
                    reader, writer = await asyncio.open_connection("127.0.0.1", serve.port)
                except OSError:
                    await asyncio.sleep(0.1)
                    continue
                try:
                    await asyncio.wait_for(reader.read(1), max(0.0, until - time.monotonic()))
                except (OSError, asyncio.TimeoutError):
                    pass
                writer.close()

        async def health() -> bool:
            status = await exchange(serve.port, HEALTHZ)
            return status is not None and status.startswith("HTTP/1.1 200")

        holders = [asyncio.create_task(hold()) for _ in range(300)]
        await asyncio.sleep(1)
        answered = await every(2, until, health)
        await asyncio.gather(*holders)
        return {"probe": "idle-flood", "healthz_answered_within_5s": f"{sum(answered)} of {len(answered)}"}
    finally:
        serve.stop()


async def status_watchers(binary: str) -> dict[str, object]:
    serve = Server(binary, ["serve", "--workers", "1"])
    try:
        request = b"GET /status/events HTTP/1.1\r\nHost: x\r\n\r\n"
        deaf = []
        for _ in range(32):
            reader, writer = await asyncio.open_connection("127.0.0.1", serve.port)
            writer.write(request)
            await reader.readline()
            deaf.append(writer)
        refused = await exchange(serve.port, request)
        started = time.monotonic()
        placed = None
        while time.monotonic() - started < 120:
            status = await exchange(serve.port, request, wait=2)
            if status is not None and status.startswith("HTTP/1.1 200"):
                placed = time.monotonic() - started
                break
            await asyncio.sleep(1)
        for writer in deaf:
            writer.close()
        return {
            "probe": "status-watchers",
            "watcher_33_at_once": refused,
            "watcher_33_placed_after_s": placed,
        }
    finally:
        serve.stop()


async def transfer_coding(binary: str) -> dict[str, object]:
    upstream, serve, proxy = serve_and_proxy(binary)
    try:
        chunked = b"Transfer-Encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
        api = await exchange(serve.port, b"POST /v1/keys/k/permits HTTP/1.1\r\nHost: x\r\n" + chunked)
        proxied = await exchange(proxy.port, b"POST /u HTTP/1.1\r\nHost: x\r\nX-Tenant: t\r\n" + chunked)
        return {"probe": "transfer-coding", "serve": api, "proxy": proxied}
    finally:
        serve.stop()
        proxy.stop()
        upstream.stop()


PROBES = {
    "slow-bodies": slow_bodies,
    "idle-flood": idle_flood,
    "status-watchers": status_watchers,
    "transfer-coding": transfer_coding,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binary")
    parser.add_argument("--only", choices=sorted(PROBES))
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    for name, probe in PROBES.items():
        if args.only in (None, name):
            print(json.dumps(asyncio.run(probe(args.binary))), flush=True)


if __name__ == "__main__":
    main()
