"""Rust and Python processes on one Redis enforce one limit; inflight serve sees Python's permits and
Python sees (and can release) the server's; their waiters share one queue per key. Skipped only when the
inflight binary is not built."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis

from inflight_client import HttpLimiter, RedisLimiter, TooManyRequests, TooManyWaiters

# in_flight as the scripts count it: the leases plus the extra weight, read in one atomic step.
PROBE = """
return redis.call('ZCARD', KEYS[1]) + tonumber(redis.call('HGET', KEYS[2], '') or '0')
"""


def test_rust_and_python_hammering_one_key_never_pass_its_limit(
    inflight: Path, r: redis.Redis, redis_url: str
) -> None:
    bench = subprocess.Popen(
        [
            str(inflight), "bench", "--store", redis_url, "--tasks", "16", "--limit", "4",
            "--hold", "1ms", "--duration", "3s", "--redis-prefix", "inflight:",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    limiter = RedisLimiter(redis.Redis.from_url(redis_url), default_limit=4)
    probe = r.register_script(PROBE)
    stop = threading.Event()
    admitted = [0]
    refused = [0]
    samples: list[int] = []
    lock = threading.Lock()

    def python_load() -> None:
        while not stop.is_set():
            try:
                permit = limiter.try_acquire("bench-0")
            except TooManyRequests:
                with lock:
                    refused[0] += 1
                continue
            time.sleep(0.001)
            permit.release()
            with lock:
                admitted[0] += 1

    def sample() -> None:
        while not stop.is_set():
            samples.append(int(probe(keys=["inflight:{bench-0}:leases", "inflight:{bench-0}:permits"])))

    threads = [threading.Thread(target=python_load) for _ in range(6)]
    threads.append(threading.Thread(target=sample))
    for t in threads:
        t.start()
    try:
        out, _ = bench.communicate(timeout=60)
    finally:
        stop.set()
        for t in threads:
            t.join()
        limiter.close()
    report: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    assert bench.returncode == 0
    assert report["pairs_per_sec"] > 0, report
    assert report["max_in_flight_seen"] <= 4, report
    assert admitted[0] > 0 and refused[0] > 0, (admitted, refused)
    assert len(samples) > 100
    assert max(samples) <= 4, max(samples)
    assert max(samples) == 4  # the key was really crowded, by both languages together


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_serve_and_python_see_each_others_permits(serve_factory: Any, r: redis.Redis, redis_url: str) -> None:
    serve = serve_factory("--store", redis_url, "--default-limit", "3", "--limit", "tenant:*=2,max=5")
    with RedisLimiter(r, default_limit=3, limits=[{"keys": "tenant:*", "default": 2, "max": 5}]) as limiter:
        permit = limiter.try_acquire("shared", weight=2)
        seen = get(f"{serve.url}/v1/keys/shared")
        assert (seen["limit"], seen["in_flight"]) == (3, 2)

        status, rust = post(f"{serve.url}/v1/keys/shared/permits", {})
        assert status == 201, rust
        assert limiter.status("shared").in_flight == 3
        with pytest.raises(TooManyRequests):
            limiter.try_acquire("shared")
        status, refused = post(f"{serve.url}/v1/keys/shared/permits", {})
        assert status == 429, refused

        # The server's generated id (a UUID) is the same permit when Python names it.
        assert limiter.release("shared", rust["id"]) is True
        assert get(f"{serve.url}/v1/keys/shared")["in_flight"] == 2
        permit.release()
        assert get(f"{serve.url}/v1/keys/shared")["in_flight"] == 0

        # Classes and overrides agree: an override set from Python caps the server's admissions.
        limiter.set_limit("tenant:a", 9)
        assert get(f"{serve.url}/v1/keys/tenant:a")["limit"] == 5
        limiter.set_limit("tenant:a", 1)
        status, _ = post(f"{serve.url}/v1/keys/tenant:a/permits", {"id": "req-1"})
        assert status == 201
        with pytest.raises(TooManyRequests):
            limiter.try_acquire("tenant:a")
        assert limiter.try_acquire("tenant:a", id="req-1").in_flight == 1  # the same id counts once


def test_python_and_rust_waiters_share_one_queue(serve_factory: Any, r: redis.Redis, redis_url: str) -> None:
    """Waiters of inflight serve (Rust's Limiter::acquire, asked through HttpLimiter's wait_ms, priority
    and flow) and of a Python RedisLimiter take tickets in one queue: admitted by priority, then by
    their flow's round (flows "" and "tenant-a" each have two tickets: rounds 0 and 1), then in arrival
    order, whichever language waits."""
    from test_tickets import BOUND, run_waiters, tickets, until_tickets

    serve = serve_factory("--store", redis_url, "--default-limit", "1")
    rust = HttpLimiter(serve.url)
    python = RedisLimiter(redis.Redis.from_url(redis_url), default_limit=1)
    try:
        holder = python.try_acquire("k")
        starts = [
            lambda: rust.acquire("k", BOUND),
            lambda: python.acquire("k", BOUND),
            lambda: rust.acquire("k", BOUND, flow="tenant-a"),
            lambda: python.acquire("k", BOUND, flow="tenant-a"),
            lambda: python.acquire("k", BOUND, priority=3),
            lambda: rust.acquire("k", BOUND, priority=9),
        ]
        order = run_waiters(r, starts, holder, holder.release)
        # priority 9 (Rust), 3 (Python); round 0: "" (Rust), "tenant-a" (Rust); round 1: "" and "tenant-a"
        # (Python).
        assert order == [5, 4, 0, 2, 1, 3]
        assert tickets(r) == 0
        assert get(f"{serve.url}/v1/keys/k")["in_flight"] == 0

        # A Rust waiter that times out leaves the queue too; one that finds it at its bound is refused
        # with the API's too_many_waiters.
        holder = python.try_acquire("k")
        with pytest.raises(TooManyRequests):
            rust.acquire("k", 0.2)
        until_tickets(r, 0)
        with r.pipeline(transaction=False) as pipe:
            for n in range(10_000):
                pipe.zadd("inflight:{k}:queue", {f"ff0000000000{n + 1:010x} 1 nobody#{n}": 0})
            pipe.execute()
        with pytest.raises(TooManyWaiters):
            rust.acquire("k", 5.0)
        holder.release()
    finally:
        rust.close()
        python.close()
