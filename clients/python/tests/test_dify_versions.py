"""Both versions of Dify's limiter in use (``dify_versions.py``) beside inflight's drop-in on Dify's layout,
on one Redis and one app: what each admits, what each leaves to the other, and how far they go over.

The multi-process runs start one process per worker; each enters, holds a moment and exits in a loop and
logs its held spans, and the test computes the most spans open at once. The log's spans lie inside the
spans in Redis, so the figure never exceeds what Redis held: with the newest Dify the runs assert that it
never passes the limit; with the older one they report how far it went (docs/dify.md, section 3).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from dify_versions import (
    STALE_AFTER,
    NewestDify,
    OlderDify,
    Refused,
    active_key,
    limit_key,
    max_overlap,
    run,
)

from inflight_client import RedisLimiter, dify

APP = "0b6a3c4e-2f1d-4e5a-9c8b-7d6e5f4a3b2c"


@pytest.fixture
def drop_in(r: redis.Redis) -> Iterator[RedisLimiter]:
    limiter = dify.configure(r, layout="dify", lease=5.0)
    yield limiter
    limiter.close()


def test_max_overlap_counts_spans_open_at_one_instant() -> None:
    assert max_overlap([]) == 0
    assert max_overlap([(0.0, 1.0), (1.0, 2.0)]) == 1  # one ends as the next starts: never two
    assert max_overlap([(0.0, 3.0), (1.0, 2.0), (1.5, 4.0), (3.5, 5.0)]) == 3


def test_the_older_dify_lets_a_racing_worker_past_the_limit(r: redis.Redis) -> None:
    a = OlderDify(r, APP, 1)
    b = OlderDify(r, APP, 1)
    # b enters between a's HLEN and a's HSET: both saw 0 < 1, both are admitted.
    a.enter(between=lambda: b.enter())
    assert r.hlen(active_key(APP)) == 2
    with pytest.raises(Refused, match=f"for {APP} is 1"):
        a.enter()


def test_the_older_dify_racing_the_drop_in_goes_past_the_limit(r: redis.Redis, drop_in: RedisLimiter) -> None:
    older = OlderDify(r, APP, 2)
    patched = dify.RateLimit(APP, 2)
    patched.enter()
    # The drop-in admits atomically, but the older Dify checked before that admission and writes after.
    older.enter(between=patched.enter)
    assert r.hlen(active_key(APP)) == 3
    with pytest.raises(dify.AppInvokeQuotaExceededError):
        patched.enter()  # the drop-in never admits past what it sees


def test_the_newest_dify_and_the_drop_in_enforce_one_cap(r: redis.Redis, drop_in: RedisLimiter) -> None:
    newest = NewestDify(r, APP, 3)
    patched = dify.RateLimit(APP, 3)
    ids = [newest.enter(), patched.enter(), newest.enter()]
    with pytest.raises(Refused):
        newest.enter()
    with pytest.raises(dify.AppInvokeQuotaExceededError):
        patched.enter()
    assert drop_in.status(APP).in_flight == 3
    newest.exit(ids[1])  # Dify's exit of an id the drop-in admitted: an HDEL, as any exit
    patched.exit(ids[0])  # and the other way round
    assert r.hlen(active_key(APP)) == 1
    assert patched.enter() and newest.enter()


def test_the_newest_dify_rereads_the_limit_only_every_five_minutes(
    r: redis.Redis, drop_in: RedisLimiter
) -> None:
    now = [time.time()]
    newest = NewestDify(r, APP, 3, clock=lambda: now[0])
    assert int(r.get(limit_key(APP)) or 0) == 3
    patched = dify.RateLimit(APP, 3)  # (its construction writes 3, as Dify's does)
    drop_in.set_limit(APP, 1)  # a limit set through inflight: Dify's limit key
    patched_id = patched.enter()
    with pytest.raises(dify.AppInvokeQuotaExceededError, match="is 1"):
        patched.enter()  # the drop-in applies it at once
    newest.enter()  # the newest Dify still admits on the limit it read at construction
    assert r.hlen(active_key(APP)) == 2
    now[0] += 301  # five minutes later: its next enter flushes, reading 1 back from Redis
    with pytest.raises(Refused, match="is 1"):
        newest.enter()
    assert newest.max_active_requests == 1
    patched.exit(patched_id)


def test_a_dify_worker_constructed_with_another_limit_overwrites_inflights(
    r: redis.Redis, drop_in: RedisLimiter
) -> None:
    newest = NewestDify(r, APP, 3)
    drop_in.set_limit(APP, 1)
    newest.construct_again(5)  # the app's setting changed in Dify: written at once, with its TTL
    assert int(r.get(limit_key(APP)) or 0) == 5
    assert 0 < r.ttl(limit_key(APP)) <= 86400
    OlderDify(r, APP, 2)  # the older version writes on construction as well
    assert int(r.get(limit_key(APP)) or 0) == 2
    assert drop_in.status(APP).limit == 2


def test_difys_flush_evicts_its_stale_entries_not_the_drop_ins_live_ones(
    r: redis.Redis, drop_in: RedisLimiter
) -> None:
    now = [time.time()]
    newest = NewestDify(r, APP, 5, clock=lambda: now[0])
    patched = dify.RateLimit(APP, 5)
    live = patched.enter()
    r.hset(active_key(APP), "crashed", str(now[0] - STALE_AFTER - 60))  # a Dify worker died 11 min ago
    r.hset(active_key(APP), "recent", str(now[0] - 60))
    now[0] += 301
    newest.enter("next")  # flushes first
    assert set(r.hkeys(active_key(APP))) == {live.encode(), b"recent", b"next"}
    assert 0 < r.ttl(active_key(APP)) <= 86400  # the flush gives the hash Dify's one-day TTL
    patched.exit(live)


def test_an_unlimited_app_touches_no_redis(r: redis.Redis) -> None:
    for version in (OlderDify(r, APP, 0), NewestDify(r, APP, 0)):
        assert version.enter() == "unlimited_request_id"
        version.exit("unlimited_request_id")
    assert r.dbsize() == 0  # neither constructing nor entering wrote anything


LIMIT = 3
SECONDS = 1.5
HOLD = 0.002


def test_processes_of_the_newest_dify_and_of_the_drop_in_never_pass_the_limit(
    redis_url: str, r: redis.Redis, tmp_path: Path
) -> None:
    kinds = ["newest"] * 3 + ["inflight"] * 3
    result = run(redis_url, kinds, APP, LIMIT, SECONDS, HOLD, tmp_path)
    print(f"newest Dify + drop-in: {result}")
    assert result["max_overlap"] <= LIMIT
    # They contended for the same slots (which kind got how many is the scheduler's: not asserted).
    assert sum(result["admitted"].values()) > 0 and sum(result["refused"].values()) > 0
    assert r.hlen(active_key(APP)) == 0


def test_processes_of_the_older_dify_go_past_the_limit_by_at_most_their_race(
    redis_url: str, r: redis.Redis, tmp_path: Path, record_property: object
) -> None:
    kinds = ["older"] * 3 + ["inflight"] * 3
    result = run(redis_url, kinds, APP, LIMIT, SECONDS, HOLD, tmp_path)
    print(f"older Dify + drop-in: {result}")
    # An older worker's HSET follows a count < LIMIT it read; between the two, each other worker can add
    # at most one entry. How far a run actually goes over is luck: docs/dify.md quotes measured figures.
    assert result["max_overlap"] <= LIMIT - 1 + len(kinds)
    assert sum(result["admitted"].values()) > 0 and sum(result["refused"].values()) > 0
    assert r.hlen(active_key(APP)) == 0


@pytest.mark.parametrize("version", [OlderDify, NewestDify])
def test_difys_enter_refuses_a_held_id_again_when_the_app_is_full(
    r: redis.Redis, version: type[OlderDify]
) -> None:
    # Dify's rate_limit_context enters the request's id a second time; both versions count before they
    # write, so the request holding the last slot is refused its own second enter (the drop-in admits
    # it: test_dify_suite.py::test_reentering_a_held_id_at_the_limit_is_admitted).
    dify_worker = version(r, APP, 1)
    request_id = dify_worker.enter()
    with pytest.raises(Refused):
        dify_worker.enter(request_id)
    assert r.hlen(active_key(APP)) == 1
