"""What the middleware tests share: web servers run as subprocesses on free ports (killed at the end,
with their workers), a client on raw sockets, and polls with a generous deadline."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis
from conftest import ROOT, free_port

APPS = Path(__file__).resolve().parent / "apps"
EXAMPLES = ROOT / "examples"
DEADLINE = 20.0  # seconds, for every poll and read


def uvicorn(target: str, port: int) -> list[str]:
    return [sys.executable, "-m", "uvicorn", target, "--host", "127.0.0.1", "--port", str(port)]


def gunicorn(target: str, port: int, worker: str) -> list[str]:
    shapes = {
        "sync": ["-w", "4"],
        "gthread": ["-k", "gthread", "-w", "2", "--threads", "4"],
        "gevent": ["-k", "gevent", "-w", "2", "--worker-connections", "50"],
    }
    return [sys.executable, "-m", "gunicorn", *shapes[worker], "-b", f"127.0.0.1:{port}", target]


class Server:
    def __init__(self, port: int, log: Path) -> None:
        self.port = port
        self.log = log


@contextlib.contextmanager
def running(
    command: Callable[[int], list[str]], env: dict[str, str], path: Path, tmp: Path, ready: str = "/ready"
) -> Iterator[Server]:
    """Runs ``command(port)`` with ``path`` on its PYTHONPATH until ``ready`` answers 200; at the end kills
    its process group (the server and its workers)."""
    port = free_port()
    log = tmp / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command(port),
            cwd=tmp,
            env={**os.environ, **env, "PYTHONPATH": str(path)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Server(port, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if request(port, ready, timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class Exchange:
    """One GET on its own connection (``Connection: close``), read as far as the test says."""

    def __init__(self, port: int, path: str, headers: dict[str, str] | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
        lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.data = b""

    def until(self, marker: bytes) -> bytes:
        """What came so far, once ``marker`` has."""
        while marker not in self.data:
            chunk = self.sock.recv(65536)
            assert chunk, f"the connection closed before {marker!r}: {self.data!r}"
            self.data += chunk
        return self.data

    def status(self) -> int:
        return int(self.until(b"\r\n").split(b" ", 2)[1])

    def rest(self) -> bytes:
        """Everything, once the server has closed the connection."""
        while chunk := self.sock.recv(65536):
            self.data += chunk
        self.close()
        return self.data

    def close(self) -> None:
        self.sock.close()


def parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """The status, headers (names in lower case) and body of a whole answer."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split(" ", 2)[1]), headers, body


def request(port: int, path: str, timeout: float = DEADLINE) -> tuple[int, dict[str, str], bytes]:
    exchange = Exchange(port, path)
    exchange.sock.settimeout(timeout)
    return parse(exchange.rest())


def eventually(condition: Callable[[], bool], what: str) -> None:
    """Polls ``condition`` until it holds; fails after ``DEADLINE`` seconds."""
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def eventually_value(condition: Callable[[], Any], what: str) -> Any:
    """Polls ``condition`` until its value is truthy, and answers it; fails after ``DEADLINE`` seconds."""
    deadline = time.monotonic() + DEADLINE
    while not (value := condition()):
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)
    return value


def new_key(prefix: str = "app") -> str:
    return f"{prefix}:{uuid.uuid4().hex[:8]}"


def new_rid() -> str:
    return uuid.uuid4().hex


def go(r: redis.Redis, rid: str) -> None:
    """Lets the app's request ``rid`` go on."""
    r.rpush(f"test:go:{rid}", 1)


def seen(r: redis.Redis, key: str) -> list[int]:
    """The in-flight counts the app saw, one per admitted request."""
    return [int(v) for v in r.lrange(f"test:seen:{key}", 0, -1)]


def calls(r: redis.Redis, key: str) -> int:
    return int(r.get(f"test:calls:{key}") or 0)


def queued(r: redis.Redis, key: str) -> int:
    """Waiters in the key's queue (queue.lua)."""
    return int(r.zcard(f"inflight:{{{key}}}:queue"))


def refusal(raw: bytes) -> tuple[int, dict[str, str], dict[str, Any]]:
    status, headers, body = parse(raw)
    return status, headers, json.loads(body)


def stream(server: Server, key: str, rid: str, then: str = "end", wait: bool = False) -> Exchange:
    """A request to the app's ``/stream`` route of ``key``, released by ``go(r, rid)``."""
    return Exchange(server.port, f"/stream?key={key}&rid={rid}&then={then}" + ("&wait=1" if wait else ""))
