"""Dify's released limiter (``dify_released.py``: Dify 1.16.1, and every release back to 1.7.2 without a
prefix) beside inflight's drop-in, ``RedisLimiter(layout="dify")`` and ``inflight serve --layout dify``, on
one Redis and one app, with Dify's ``REDIS_KEY_PREFIX`` and without: what each admits, what each leaves to
the other, and how far they go over.

The multi-process runs start one process per worker; each enters, holds a moment and exits in a loop and
logs its held spans, and the test computes the most spans open at once. The log's spans lie inside the
spans in Redis, so the figure never exceeds what Redis held: with every worker patched the runs assert
that it never passes the limit; with released Dify workers among them they assert only the race's bound
(docs/dify.md quotes measured figures).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from dify_released import (
    STALE_AFTER,
    DifyRedis,
    Refused,
    ReleasedDify,
    active_key,
    limit_key,
    max_overlap,
    run,
)

from inflight_client import RedisLimiter, dify

APP = "0b6a3c4e-2f1d-4e5a-9c8b-7d6e5f4a3b2c"
PREFIXES = ["", "acme"]


@pytest.fixture(params=PREFIXES, ids=["no-prefix", "prefix"])
def prefix(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def client(r: redis.Redis, prefix: str) -> DifyRedis:
    """Dify's ``redis_client``, with ``REDIS_KEY_PREFIX`` or without."""
    return DifyRedis(r, prefix)


@pytest.fixture
def drop_in(client: DifyRedis, prefix: str) -> Iterator[RedisLimiter]:
    """The drop-in as the guide's patch configures it: Dify's client, Dify's prefix."""
    limiter = dify.configure(client, layout="dify", lease=5.0, key_prefix=prefix)  # type: ignore[arg-type]
    yield limiter
    limiter.close()


def test_max_overlap_counts_spans_open_at_one_instant() -> None:
    assert max_overlap([]) == 0
    assert max_overlap([(0.0, 1.0), (1.0, 2.0)]) == 1  # one ends as the next starts: never two
    assert max_overlap([(0.0, 3.0), (1.0, 2.0), (1.5, 4.0), (3.5, 5.0)]) == 3


def test_the_model_names_keys_as_difys_wrapper_does(r: redis.Redis) -> None:
    ReleasedDify(DifyRedis(r, " acme "), APP, 2).enter("x")
    assert sorted(r.keys()) == [active_key(APP, "acme").encode(), limit_key(APP, "acme").encode()]
    assert active_key(APP, "acme") == f"acme:dify:rate_limit:{APP}:active_requests"


def test_released_dify_lets_a_racing_worker_past_the_limit(
    client: DifyRedis, r: redis.Redis, prefix: str
) -> None:
    a = ReleasedDify(client, APP, 1)
    b = ReleasedDify(client, APP, 1)
    # b enters between a's HLEN and a's HSET: both saw 0 < 1, both are admitted.
    a.enter(between=lambda: b.enter())
    assert r.hlen(active_key(APP, prefix)) == 2
    with pytest.raises(Refused, match=f"for {APP} is 1"):
        a.enter()


def test_released_dify_and_the_drop_in_count_in_one_hash_with_any_prefix(
    client: DifyRedis, r: redis.Redis, prefix: str, drop_in: RedisLimiter
) -> None:
    released = ReleasedDify(client, APP, 3)
    patched = dify.RateLimit(APP, 3)
    ids = [released.enter(), patched.enter(), released.enter()]
    with pytest.raises(Refused):
        released.enter()  # the drop-in's entry counted by Dify's HLEN
    with pytest.raises(dify.AppInvokeQuotaExceededError):
        patched.enter()  # and Dify's entries by the drop-in
    assert drop_in.status(APP).in_flight == 3
    assert r.hlen(active_key(APP, prefix)) == 3
    if prefix:
        assert r.keys("dify:*") == []  # nothing under the unprefixed names
    released.exit(ids[1])  # Dify's exit of an id the drop-in admitted: an HDEL, as any exit
    patched.exit(ids[0])  # and the other way round
    assert r.hlen(active_key(APP, prefix)) == 1
    assert patched.enter() and released.enter()


def test_redis_limiter_on_difys_layout_counts_with_released_dify(
    client: DifyRedis, r: redis.Redis, prefix: str
) -> None:
    released = ReleasedDify(client, APP, 2)
    with RedisLimiter(r, default_limit=5, layout="dify", dify_key_prefix=prefix) as limiter:
        permit = limiter.try_acquire(APP)
        assert (permit.limit, permit.in_flight) == (2, 1)  # Dify's limit key is the app's
        released.enter()
        with pytest.raises(Refused):
            released.enter()
        permit.release()
        assert r.hlen(active_key(APP, prefix)) == 1


def test_released_dify_rereads_the_limit_only_every_five_minutes(
    client: DifyRedis, r: redis.Redis, prefix: str, drop_in: RedisLimiter
) -> None:
    now = [time.time()]
    released = ReleasedDify(client, APP, 3, clock=lambda: now[0])
    assert int(r.get(limit_key(APP, prefix)) or 0) == 3
    patched = dify.RateLimit(APP, 3)  # (its construction writes 3, as Dify's does)
    drop_in.set_limit(APP, 1)  # a limit set through inflight: Dify's limit key
    patched_id = patched.enter()
    with pytest.raises(dify.AppInvokeQuotaExceededError, match="is 1"):
        patched.enter()  # the drop-in applies it at once
    released.enter()  # Dify still admits on the limit it read at construction
    assert r.hlen(active_key(APP, prefix)) == 2
    now[0] += 301  # five minutes later: its next enter flushes, reading 1 back from Redis
    with pytest.raises(Refused, match="is 1"):
        released.enter()
    assert released.max_active_requests == 1
    patched.exit(patched_id)


def test_a_dify_worker_constructed_with_another_limit_overwrites_inflights(
    client: DifyRedis, r: redis.Redis, prefix: str, drop_in: RedisLimiter
) -> None:
    released = ReleasedDify(client, APP, 3)
    drop_in.set_limit(APP, 1)
    released.construct_again(5)  # the app's setting changed in Dify: written at once, with its TTL
    assert int(r.get(limit_key(APP, prefix)) or 0) == 5
    assert 0 < r.ttl(limit_key(APP, prefix)) <= 86400
    assert drop_in.status(APP).limit == 5


def test_difys_flush_evicts_its_stale_entries_not_the_drop_ins_live_ones(
    client: DifyRedis, r: redis.Redis, prefix: str, drop_in: RedisLimiter
) -> None:
    now = [time.time()]
    released = ReleasedDify(client, APP, 5, clock=lambda: now[0])
    patched = dify.RateLimit(APP, 5)
    live = patched.enter()
    hash_name = active_key(APP, prefix)
    r.hset(hash_name, "crashed", str(now[0] - STALE_AFTER - 60))  # a Dify worker died 11 min ago
    r.hset(hash_name, "recent", str(now[0] - 60))
    now[0] += 301
    released.enter("next")  # flushes first
    assert set(r.hkeys(hash_name)) == {live.encode(), b"recent", b"next"}
    assert 0 < r.ttl(hash_name) <= 86400  # the flush gives the hash Dify's one-day TTL
    patched.exit(live)


def test_an_unlimited_app_touches_no_redis(client: DifyRedis, r: redis.Redis) -> None:
    released = ReleasedDify(client, APP, 0)
    assert released.enter() == "unlimited_request_id"
    released.exit("unlimited_request_id")
    assert r.dbsize() == 0  # neither constructing nor entering wrote anything


def test_released_difys_enter_refuses_a_held_id_again_when_the_app_is_full(
    client: DifyRedis, r: redis.Redis, prefix: str
) -> None:
    # Dify's rate_limit_context enters the request's id a second time; Dify counts before it writes, so
    # the request holding the last slot is refused its own second enter (the drop-in admits it:
    # test_dify_suite.py::test_reentering_a_held_id_at_the_limit_is_admitted).
    released = ReleasedDify(client, APP, 1)
    request_id = released.enter()
    with pytest.raises(Refused):
        released.enter(request_id)
    assert r.hlen(active_key(APP, prefix)) == 1


SECONDS = 1.5
HOLD = 0.002


def test_every_patched_way_in_keeps_one_cap_with_and_without_a_prefix(
    redis_url: str, r: redis.Redis, tmp_path: Path, serve_factory: Any, prefix: str
) -> None:
    """Every worker patched: drop-ins, ``RedisLimiter(layout="dify")`` and ``serve --layout dify``
    processes on one app, beside an entry a released Dify worker holds (in the prefixed hash, with a
    prefix) for the whole run: together they never hold more than the app's limit."""
    limit = 3
    serve = serve_factory(
        "--store", redis_url, "--layout", "dify", "--default-limit", str(limit), "--redis-key-prefix", prefix
    )
    ReleasedDify(DifyRedis(r, prefix), APP, limit).enter("held-by-dify")
    kinds = ["dropin"] * 2 + ["limiter"] * 2 + ["serve"] * 2
    result = run(redis_url, kinds, APP, limit, SECONDS, HOLD, tmp_path, prefix, serve.url)
    print(f"patched, prefix {prefix!r}: {result}")
    assert result["max_overlap"] <= limit - 1  # Dify's entry counted by every way in
    # They contended for the same slots (which kind got how many is the scheduler's: not asserted).
    assert sum(result["admitted"].values()) > 0 and sum(result["refused"].values()) > 0
    assert r.hkeys(active_key(APP, prefix)) == [b"held-by-dify"]


def test_a_mixed_migration_goes_past_the_limit_by_at_most_difys_race(
    redis_url: str, r: redis.Redis, tmp_path: Path, serve_factory: Any, prefix: str
) -> None:
    """Released Dify workers beside every patched way in: Dify's own HLEN-then-HSET race can still
    over-admit, each of its workers by one entry at most (a count below the limit read, then written)."""
    limit = 2
    serve = serve_factory(
        "--store", redis_url, "--layout", "dify", "--default-limit", str(limit), "--redis-key-prefix", prefix
    )
    kinds = ["released"] * 2 + ["dropin"] * 2 + ["limiter", "serve"]
    result = run(redis_url, kinds, APP, limit, SECONDS, HOLD, tmp_path, prefix, serve.url)
    print(f"released Dify + patched, prefix {prefix!r}: {result}")
    # How far a run actually goes over is luck: docs/dify.md quotes measured figures.
    assert result["max_overlap"] <= limit + kinds.count("released")
    assert sum(result["admitted"].values()) > 0 and sum(result["refused"].values()) > 0
    assert r.hlen(active_key(APP, prefix)) == 0
