"""Dify's per-app limiter as released, reduced to its Redis traffic (written for these tests, in our words).

The model is of **Dify 1.16.1** (langgenius/dify, the version-bump commit 59b879d2df "chore: bump version to
1.16.1", 2026-07-28; ``docker/docker-compose.yaml`` there pins ``langgenius/dify-api:1.16.1`` and
``redis:6-alpine``): ``api/core/app/features/rate_limiting/rate_limit.py`` and the ``RedisClientWrapper`` of
``api/extensions/ext_redis.py``. Every release from 1.7.2 to 1.16.1 admits the same way; what changed is the
key prefix, which came with Dify 1.14.0 (#35139): ``prefix=""`` is every release before it, or a later
one with ``REDIS_KEY_PREFIX`` empty. (Dify's unmerged PR #39270, which would have admitted with a Lua
script, is in no release and is not modelled.)

Per app id ``A``, through the wrapper (so ``<prefix>:`` before each name when a prefix is set):

* ``dify:rate_limit:A:active_requests``: a hash, request id -> ``time.time()`` of its admission as text;
  its length is the app's count;
* ``dify:rate_limit:A:max_active_requests``: the app's limit, written with a one-day TTL.

``enter`` reads ``HLEN``, compares it with its limit in Python, then ``HSET``s the id: two round trips, so
racing workers can all pass the same check (Dify's issue #39177, open). Constructing writes the local
limit (SETEX, one day); every 5 minutes ``enter`` first "flushes": the limit is read back from Redis when
the key exists (else written again), the hash gets a one-day TTL, and entries older than 10 minutes are
deleted. ``exit`` is ``HDEL``. A limit <= 0 means unlimited (``"unlimited_request_id"``, no Redis call).

Run as a script, this module is also the worker of ``test_dify_released.py`` and the measurement quoted
in docs/dify.md (``python dify_released.py race --help``).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import redis

UNLIMITED = "unlimited_request_id"
FLUSH_EVERY = 300.0  # seconds between two flushes, checked by enter
STALE_AFTER = 600.0  # an entry older than this is deleted by a flush
ONE_DAY = timedelta(days=1)


class Refused(Exception):
    """Dify's ``AppInvokeQuotaExceededError``."""


class DifyRedis:
    """Dify's ``redis_client`` as ``RateLimit`` meets it: the names its own methods take (``get``, ``setex``,
    ``exists``, ``expire``, ``hgetall``, ``hset``, ``hdel``, ``hlen``, ...) get ``<prefix>:`` before them (the
    prefix stripped; empty: none); a ``bytes`` name and everything it does not define (``eval``,
    ``evalsha``, ``register_script``, ``pipeline``) reach the client as they are."""

    PREFIXED = frozenset(
        {"get", "set", "setex", "setnx", "delete", "incr", "expire", "exists", "ttl", "getdel", "hset"}
        | {"hgetall", "hkeys", "hexists", "hdel", "hlen", "zadd", "zremrangebyscore", "zcard"}
    )

    def __init__(self, client: redis.Redis, prefix: str = "") -> None:
        self._client = client
        self.prefix = prefix.strip()

    def name(self, name: str | bytes) -> str | bytes:
        return name if isinstance(name, bytes) else prefixed(name, self.prefix)

    def __getattr__(self, item: str) -> Any:
        method = getattr(self._client, item)
        if item not in self.PREFIXED:
            return method

        def prefixed(*names_and_args: Any, **kwargs: Any) -> Any:
            if item in ("delete", "exists"):  # every positional argument is a name
                return method(*(self.name(n) for n in names_and_args), **kwargs)
            first, *rest = names_and_args
            return method(self.name(first), *rest, **kwargs)

        return prefixed


def prefixed(name: str, prefix: str) -> str:
    prefix = prefix.strip()
    return f"{prefix}:{name}" if prefix else name


def active_key(app: str, prefix: str = "") -> str:
    return prefixed(f"dify:rate_limit:{app}:active_requests", prefix)


def limit_key(app: str, prefix: str = "") -> str:
    return prefixed(f"dify:rate_limit:{app}:max_active_requests", prefix)


class ReleasedDify:
    """Dify's released ``RateLimit`` of one app in one worker. ``between`` (tests only) runs after the
    count was read and before the id is written: the window in which another admission goes unseen."""

    def __init__(
        self,
        client: DifyRedis,
        app: str,
        max_active_requests: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.app = app
        self.clock = clock
        self.max_active_requests = max_active_requests
        self.active = f"dify:rate_limit:{app}:active_requests"
        self.limit = f"dify:rate_limit:{app}:max_active_requests"
        self.last_flush = float("-inf")
        if not self.disabled():  # a disabled app is never written at construction
            self.flush_cache(use_local_value=True)

    def construct_again(self, max_active_requests: int) -> None:
        """``RateLimit(app, n)`` again in the same process (Dify keeps one instance per app): a changed
        ``n`` is written at once."""
        changed = max_active_requests != self.max_active_requests
        self.max_active_requests = max_active_requests
        if changed:
            self.flush_cache(use_local_value=True)

    def disabled(self) -> bool:
        return self.max_active_requests <= 0

    def flush_cache(self, use_local_value: bool = False) -> None:
        self.last_flush = self.clock()
        c = self.client
        if use_local_value or not c.exists(self.limit):
            c.setex(self.limit, ONE_DAY, self.max_active_requests)
        else:
            self.max_active_requests = int(c.get(self.limit))
            c.expire(self.limit, ONE_DAY)
        if self.disabled() or not c.exists(self.active):
            return
        entries = c.hgetall(self.active)
        c.expire(self.active, ONE_DAY)
        stale = [rid for rid, at in entries.items() if self.clock() - float(at) > STALE_AFTER]
        if stale:
            c.hdel(self.active, *stale)

    def enter(self, request_id: str | None = None, between: Callable[[], object] | None = None) -> str:
        if self.disabled():
            return UNLIMITED
        if self.clock() - self.last_flush > FLUSH_EVERY:
            self.flush_cache()
        request_id = request_id or str(uuid.uuid4())
        if int(self.client.hlen(self.active)) >= self.max_active_requests:
            raise Refused(
                "Too many requests. Please try again later. The current maximum concurrent requests allowed "
                f"for {self.app} is {self.max_active_requests}."
            )
        if between is not None:
            between()
        self.client.hset(self.active, request_id, str(self.clock()))
        return request_id

    def exit(self, request_id: str) -> None:
        if request_id != UNLIMITED:
            self.client.hdel(self.active, request_id)


# --- the worker and the measurement ------------------------------------------------------------------


class _DropIn:
    """inflight's drop-in on Dify's layout, configured as the guide's patch does (Dify's wrapper, its
    prefix), with the same enter/exit as :class:`ReleasedDify`."""

    def __init__(self, client: DifyRedis, app: str, limit: int) -> None:
        from inflight_client import dify

        self.dify = dify
        self.closing = dify.configure(client, layout="dify", lease=5.0, key_prefix=client.prefix)  # type: ignore[arg-type]
        self.rate_limit = dify.RateLimit(app, limit)

    def enter(self) -> str:
        try:
            return self.rate_limit.enter()
        except self.dify.AppInvokeQuotaExceededError as refused:
            raise Refused(str(refused)) from None

    def exit(self, request_id: str) -> None:
        self.rate_limit.exit(request_id)


class _Limiter:
    """``RedisLimiter(layout="dify")``: the app id is the key, the limit its default."""

    def __init__(self, r: redis.Redis, prefix: str, app: str, limit: int, serve: str | None) -> None:
        from inflight_client import HttpLimiter, RedisLimiter

        self.app = app
        self.closing: Any = (
            HttpLimiter(serve)
            if serve
            else RedisLimiter(r, default_limit=limit, layout="dify", lease=5.0, dify_key_prefix=prefix)
        )
        self.held: dict[str, Any] = {}

    def enter(self) -> str:
        from inflight_client import TooManyRequests

        try:
            permit = self.closing.try_acquire(self.app)
        except TooManyRequests:
            raise Refused(self.app) from None
        self.held[permit.id] = permit
        return str(permit.id)

    def exit(self, request_id: str) -> None:
        self.held.pop(request_id).release()


def work(url: str, kind: str, prefix: str, app: str, limit: int, hold: float, log: Path, serve: str) -> None:
    """Sets up, says "ready" on stdout, reads how many seconds to run from stdin, then enters, holds
    ``hold`` seconds and exits in a loop. Every admission is logged as "entered exited" (monotonic
    seconds, system-wide on Linux), taken inside the held span: after ``enter`` returned and before
    ``exit`` was called, so overlaps of the log never exceed the count in Redis."""
    r = redis.Redis.from_url(url)
    client = DifyRedis(r, prefix)
    worker: Any
    if kind == "released":
        worker = ReleasedDify(client, app, limit)
    elif kind == "dropin":
        worker = _DropIn(client, app, limit)
    elif kind == "limiter":
        worker = _Limiter(r, prefix, app, limit, None)
    elif kind == "serve":
        worker = _Limiter(r, prefix, app, limit, serve)
    else:
        raise ValueError(kind)
    r.ping()
    print("ready", flush=True)
    until = time.monotonic() + float(sys.stdin.readline())
    spans: list[str] = []
    refused = 0
    while time.monotonic() < until:
        try:
            request_id = worker.enter()
        except Refused:
            refused += 1
            continue
        entered = time.monotonic()
        deadline = entered + hold
        while time.monotonic() < deadline:
            pass  # busy: a sleep would hand the CPU to a racing worker in the middle of our span
        exited = time.monotonic()
        worker.exit(request_id)
        spans.append(f"{entered!r} {exited!r}")
    log.write_text(json.dumps({"kind": kind, "refused": refused, "spans": spans}))
    if hasattr(worker, "closing"):
        worker.closing.close()
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
    url: str,
    kinds: list[str],
    app: str,
    limit: int,
    seconds: float,
    hold: float,
    logdir: Path,
    prefix: str = "",
    serve: str = "",
) -> dict[str, Any]:
    """Runs one worker process per entry of ``kinds`` on one app (``serve``: the URL of an ``inflight serve
    --layout dify`` for the kind of that name); returns the overlap and the counts."""
    procs = []
    try:
        for n, kind in enumerate(kinds):
            log = logdir / f"worker-{n}.json"
            args = [url, kind, prefix, app, str(limit), repr(hold), str(log), serve]
            cmd = [sys.executable, __file__, "worker", *args]
            procs.append((subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE), log))
        deadline = time.monotonic() + 60
        for proc, _ in procs:  # every worker set up before any enters
            assert proc.stdout is not None
            if not select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise RuntimeError("a worker did not say it was ready within 60 s")
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
    for name in ("url", "kind", "prefix", "app", "limit", "hold", "log", "serve"):
        worker.add_argument(name)
    race = sub.add_parser("race", help="measure how far a mix of workers goes over the limit")
    race.add_argument("--url", default="redis://127.0.0.1:6379/15", help="a Redis it may write to")
    race.add_argument("--kinds", default="released*8", help="e.g. released*3,dropin*4 (also limiter, serve)")
    race.add_argument("--prefix", default="", help="Dify's REDIS_KEY_PREFIX")
    race.add_argument("--serve", default="", help="an inflight serve --layout dify, for the kind serve")
    race.add_argument("--limit", type=int, default=4)
    race.add_argument("--runs", type=int, default=10)
    race.add_argument("--seconds", type=float, default=2.0)
    race.add_argument("--hold", type=float, default=0.002)
    args = parser.parse_args()
    if args.command == "worker":
        work(
            args.url,
            args.kind,
            args.prefix,
            args.app,
            int(args.limit),
            float(args.hold),
            Path(args.log),
            args.serve,
        )
        return
    kinds = [k for part in args.kinds.split(",") for k in [part.split("*")[0]] * int(part.split("*")[1])]
    import tempfile

    worst = 0
    for n in range(args.runs):
        app = f"race-{os.getpid()}-{n}"
        with tempfile.TemporaryDirectory() as tmp:
            result = run(
                args.url, kinds, app, args.limit, args.seconds, args.hold, Path(tmp), args.prefix, args.serve
            )
        redis.Redis.from_url(args.url).delete(active_key(app, args.prefix), limit_key(app, args.prefix))
        worst = max(worst, result["max_overlap"])
        print(f"run {n + 1}: max in flight {result['max_overlap']} (limit {args.limit}) {result}")
    over = worst - args.limit
    print(f"{args.runs} runs of {args.kinds}: max in flight {worst}, limit {args.limit}, over by {over}")


if __name__ == "__main__":
    _main()
