"""Dify's per-app limiter, both versions in use, reduced to their Redis traffic (written for these tests).

Dify's ``core/app/features/rate_limiting/rate_limit.py`` keeps, per app id ``A``:

* ``dify:rate_limit:A:active_requests``: a hash, request id -> ``time.time()`` of its admission as text;
  its length is the app's count;
* ``dify:rate_limit:A:max_active_requests``: the app's limit, written with a one-day TTL.

Both versions below do the same bookkeeping and differ only in how ``enter`` admits:

* :class:`OlderDify` (Dify until its atomic fix): reads ``HLEN``, compares it with its limit in Python,
  then ``HSET``s the id: two round trips, so racing workers can all pass the same check;
* :class:`NewestDify`: one Lua script (``register_script``) does the comparison and the ``HSET`` inside
  Redis; a constructor call with a different limit rewrites the limit key at once.

Common to both: constructing writes the local limit (SETEX, one day); every 5 minutes ``enter`` first
"flushes": the limit is read back from Redis when the key exists (else written again), the hash gets a
one-day TTL, and entries older than 10 minutes are deleted. ``exit`` is ``HDEL``. A limit <= 0 means
unlimited (``"unlimited_request_id"``, no Redis call).

Run as a script, this module is also the worker of ``test_dify_versions.py`` and the measurement quoted
in docs/dify.md (``python dify_versions.py race --help``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

UNLIMITED = "unlimited_request_id"
FLUSH_EVERY = 300.0  # seconds between two flushes, checked by enter
STALE_AFTER = 600.0  # an entry older than this is deleted by a flush
ONE_DAY = 86400


class Refused(Exception):
    """Dify's ``AppInvokeQuotaExceededError``."""


def active_key(app: str) -> str:
    return f"dify:rate_limit:{app}:active_requests"


def limit_key(app: str) -> str:
    return f"dify:rate_limit:{app}:max_active_requests"


class OlderDify:
    """The HLEN-then-HSET version. ``between`` (tests only) runs after the count was read and before the
    id is written: the window in which another worker's admission goes unseen."""

    def __init__(
        self,
        r: redis.Redis,
        app: str,
        max_active_requests: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.r = r
        self.app = app
        self.clock = clock
        self.max_active_requests = max_active_requests
        self.last_flush = float("-inf")
        if not self.disabled():
            self.flush_cache(use_local_value=True)

    def disabled(self) -> bool:
        return self.max_active_requests <= 0

    def flush_cache(self, use_local_value: bool = False) -> None:
        if self.disabled() and not isinstance(self, NewestDify):
            return  # the older version skips a disabled app's flush; the newest still syncs its limit
        self.last_flush = self.clock()
        stored = None if use_local_value else self.r.get(limit_key(self.app))
        if stored is None:
            self.r.set(limit_key(self.app), self.max_active_requests, ex=ONE_DAY)  # Dify: SETEX, same effect
        else:
            self.max_active_requests = int(stored)
            self.r.expire(limit_key(self.app), ONE_DAY)
        if self.disabled() or not self.r.exists(active_key(self.app)):
            return
        entries = self.r.hgetall(active_key(self.app))
        self.r.expire(active_key(self.app), ONE_DAY)
        now = self.clock()
        stale = [rid for rid, at in entries.items() if now - float(at) > STALE_AFTER]
        if stale:
            self.r.hdel(active_key(self.app), *stale)

    def _maybe_flush(self) -> None:
        if self.clock() - self.last_flush > FLUSH_EVERY:
            self.flush_cache()

    def enter(self, request_id: str | None = None, between: Callable[[], object] | None = None) -> str:
        if self.disabled():
            return UNLIMITED
        self._maybe_flush()
        request_id = request_id or str(uuid.uuid4())
        count = int(self.r.hlen(active_key(self.app)))
        if count >= self.max_active_requests:
            raise Refused(self._message())
        if between is not None:
            between()
        self.r.hset(active_key(self.app), request_id, str(self.clock()))
        return request_id

    def exit(self, request_id: str) -> None:
        if request_id != UNLIMITED:
            self.r.hdel(active_key(self.app), request_id)

    def _message(self) -> str:
        return (
            "Too many requests. Please try again later. The current maximum concurrent requests allowed "
            f"for {self.app} is {self.max_active_requests}."
        )


# The newest version's admission, as a script: refuse (nil) when the hash already holds the limit,
# else record the id with its timestamp.
_ADMIT = """
local held = redis.call('HLEN', KEYS[1])
if held >= tonumber(ARGV[3]) then
  return false
end
return redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
"""


class NewestDify(OlderDify):
    """The atomic version: the count check and the HSET in one Lua script."""

    def __init__(
        self,
        r: redis.Redis,
        app: str,
        max_active_requests: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(r, app, max_active_requests, clock)
        self._admit = r.register_script(_ADMIT)

    def construct_again(self, max_active_requests: int) -> None:
        """Dify's ``RateLimit(app, n)`` on the cached instance: a changed ``n`` is written at once."""
        changed = max_active_requests != self.max_active_requests
        self.max_active_requests = max_active_requests
        if changed:
            self.flush_cache(use_local_value=True)

    def enter(self, request_id: str | None = None, between: Callable[[], object] | None = None) -> str:
        if self.disabled():
            return UNLIMITED
        self._maybe_flush()
        request_id = request_id or str(uuid.uuid4())
        admitted = self._admit(
            keys=[active_key(self.app)], args=[request_id, str(self.clock()), self.max_active_requests]
        )
        if admitted is None:
            raise Refused(self._message())
        return request_id


# --- the worker and the measurement ------------------------------------------------------------------


class _DropIn:
    """inflight's drop-in on Dify's layout, with the same enter/exit as the classes above."""

    def __init__(self, r: redis.Redis, app: str, limit: int) -> None:
        from inflight_client import dify

        self.dify = dify
        self.limiter = dify.configure(r, layout="dify", lease=5.0)
        self.rate_limit = dify.RateLimit(app, limit)

    def enter(self) -> str:
        try:
            return self.rate_limit.enter()
        except self.dify.AppInvokeQuotaExceededError as refused:
            raise Refused(str(refused)) from None

    def exit(self, request_id: str) -> None:
        self.rate_limit.exit(request_id)


def work(url: str, kind: str, app: str, limit: int, hold: float, log: Path) -> None:
    """Sets up, says "ready" on stdout, reads how many seconds to run from stdin, then enters, holds
    ``hold`` seconds and exits in a loop. Every admission is logged as "entered exited" (monotonic
    seconds, system-wide on Linux), taken inside the held span: after ``enter`` returned and before
    ``exit`` was called, so overlaps of the log never exceed the count in Redis."""
    r = redis.Redis.from_url(url)
    limiter: Any
    if kind == "older":
        limiter = OlderDify(r, app, limit)
    elif kind == "newest":
        limiter = NewestDify(r, app, limit)
    elif kind == "inflight":
        limiter = _DropIn(r, app, limit)
    else:
        raise ValueError(kind)
    r.ping()
    print("ready", flush=True)
    until = time.monotonic() + float(sys.stdin.readline())
    spans: list[str] = []
    refused = 0
    while time.monotonic() < until:
        try:
            request_id = limiter.enter()
        except Refused:
            refused += 1
            continue
        entered = time.monotonic()
        deadline = entered + hold
        while time.monotonic() < deadline:
            pass  # busy: a sleep would hand the CPU to a racing worker in the middle of our span
        exited = time.monotonic()
        limiter.exit(request_id)
        spans.append(f"{entered!r} {exited!r}")
    log.write_text(json.dumps({"kind": kind, "refused": refused, "spans": spans}))
    if kind == "inflight":
        limiter.limiter.close()
    r.close()


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """The most spans open at one instant (an exit at the same instant as an enter closes first)."""
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def run(
    url: str, kinds: list[str], app: str, limit: int, seconds: float, hold: float, logdir: Path
) -> dict[str, Any]:
    """Runs one worker process per entry of ``kinds`` on one app; returns the overlap and the counts."""
    procs = []
    try:
        for n, kind in enumerate(kinds):
            log = logdir / f"worker-{n}.json"
            args = [url, kind, app, str(limit), repr(hold), str(log)]
            cmd = [sys.executable, __file__, "worker", *args]
            procs.append((subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE), log))
        for proc, _ in procs:  # every worker set up before any enters
            assert proc.stdout is not None
            if proc.stdout.readline() != b"ready\n":
                raise RuntimeError("a worker did not start")
        for proc, _ in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"{seconds!r}\n".encode())
            proc.stdin.close()
        for proc, _ in procs:
            if proc.wait(timeout=seconds + 30) != 0:
                raise RuntimeError(f"a worker failed ({proc.returncode})")
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    spans: list[tuple[float, float]] = []
    admitted: dict[str, int] = {}
    refused: dict[str, int] = {}
    for _, log in procs:
        data = json.loads(log.read_text())
        pairs = [tuple(float(x) for x in s.split()) for s in data["spans"]]
        spans.extend((a, b) for a, b in pairs)
        admitted[data["kind"]] = admitted.get(data["kind"], 0) + len(pairs)
        refused[data["kind"]] = refused.get(data["kind"], 0) + int(data["refused"])
    return {"max_overlap": max_overlap(spans), "admitted": admitted, "refused": refused}


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    worker = sub.add_parser("worker", help="one worker (started by run)")
    for name in ("url", "kind", "app", "limit", "hold", "log"):
        worker.add_argument(name)
    race = sub.add_parser("race", help="measure how far the versions go over the limit")
    race.add_argument("--url", default="redis://127.0.0.1:6379/15", help="a Redis it may write to")
    race.add_argument("--kinds", default="older*8", help="e.g. older*8 or older*4,inflight*4")
    race.add_argument("--limit", type=int, default=4)
    race.add_argument("--runs", type=int, default=10)
    race.add_argument("--seconds", type=float, default=2.0)
    race.add_argument("--hold", type=float, default=0.002)
    args = parser.parse_args()
    if args.command == "worker":
        work(args.url, args.kind, args.app, int(args.limit), float(args.hold), Path(args.log))
        return
    kinds = [k for part in args.kinds.split(",") for k in [part.split("*")[0]] * int(part.split("*")[1])]
    import tempfile

    worst = 0
    for n in range(args.runs):
        app = f"race-{os.getpid()}-{n}"
        with tempfile.TemporaryDirectory() as tmp:
            result = run(args.url, kinds, app, args.limit, args.seconds, args.hold, Path(tmp))
        redis.Redis.from_url(args.url).delete(active_key(app), limit_key(app))
        worst = max(worst, result["max_overlap"])
        print(f"run {n + 1}: max in flight {result['max_overlap']} (limit {args.limit}) {result}")
    over = worst - args.limit
    print(f"{args.runs} runs of {args.kinds}: max in flight {worst}, limit {args.limit}, over by {over}")


if __name__ == "__main__":
    _main()
