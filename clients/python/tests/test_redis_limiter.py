"""RedisLimiter against a real redis-server: the behaviour list of the issue."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from inflight_client import RedisLimiter, TooManyRequests, WeightExceedsLimit, _core


def in_flight(limiter: RedisLimiter, key: str) -> int:
    return limiter.status(key).in_flight


def wait_for(cond: object, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def test_admits_up_to_the_limit_and_refuses_at_it(limiter: RedisLimiter) -> None:
    a = limiter.try_acquire("app-1")
    b = limiter.try_acquire("app-1")
    assert (a.limit, a.in_flight, b.in_flight) == (2, 1, 2)
    with pytest.raises(TooManyRequests) as refused:
        limiter.try_acquire("app-1")
    assert (refused.value.limit, refused.value.in_flight, refused.value.key) == (2, 2, "app-1")
    limiter.try_acquire("app-2").release()  # another key has its own slots
    a.release()
    b.release()


def test_release_frees_and_is_idempotent(limiter: RedisLimiter) -> None:
    a = limiter.try_acquire("k")
    _held2 = limiter.try_acquire("k")
    assert a.release() is True
    assert a.release() is False
    a.close()
    assert in_flight(limiter, "k") == 1
    _held3 = limiter.try_acquire("k")
    with pytest.raises(TooManyRequests):
        limiter.try_acquire("k")


def test_context_manager_releases(limiter: RedisLimiter) -> None:
    with limiter.try_acquire("k") as permit:
        assert permit.held and in_flight(limiter, "k") == 1
    assert not permit.held
    assert in_flight(limiter, "k") == 0
    with pytest.raises(RuntimeError), limiter.try_acquire("k"):
        raise RuntimeError("boom")
    assert in_flight(limiter, "k") == 0


def test_given_ids_are_kept_and_a_held_id_counts_once(limiter: RedisLimiter) -> None:
    first = limiter.try_acquire("k", id="req-1")
    again = limiter.try_acquire("k", id="req-1")
    assert first.id == again.id == "req-1"
    assert again.in_flight == 1
    other = limiter.try_acquire("k", id="req-2")
    # Full, yet a held id is admitted again (a retry needs no new slot).
    retry = limiter.try_acquire("k", id="req-1")
    with pytest.raises(TooManyRequests):
        limiter.try_acquire("k", id="req-3")
    # As in Rust: permits of one process under one id hold the slot until the last of them goes.
    retry.release()
    again.release()
    assert in_flight(limiter, "k") == 2 and first.held
    first.release()
    assert in_flight(limiter, "k") == 1
    other.release()


def test_generated_ids_are_uuids_stored_as_17_bytes(limiter: RedisLimiter, r: redis.Redis) -> None:
    permit = limiter.try_acquire("app-1")
    import uuid

    u = uuid.UUID(permit.id)
    assert str(u) == permit.id
    assert r.zrange("inflight:{app-1}:leases", 0, -1) == [b"\xff" + u.bytes]
    # The same id given as its text is the same permit (as in Rust).
    assert limiter.try_acquire("app-1", id=permit.id).in_flight == 1
    assert limiter.release("app-1", permit.id) is True
    assert in_flight(limiter, "app-1") == 0


def test_weights(r: redis.Redis) -> None:
    with RedisLimiter(r, default_limit=5) as limiter:
        heavy = limiter.try_acquire("k", weight=3)
        assert heavy.in_flight == 3
        with pytest.raises(TooManyRequests) as refused:
            limiter.try_acquire("k", weight=3)
        assert refused.value.in_flight == 3
        _held4 = limiter.try_acquire("k", weight=2)
        with pytest.raises(WeightExceedsLimit):
            limiter.try_acquire("other", weight=6)
        heavy.release()
        assert in_flight(limiter, "k") == 2
        with pytest.raises(ValueError):
            limiter.try_acquire("k", weight=0)


def test_overrides_are_set_cleared_and_capped_by_the_class_max(r: redis.Redis) -> None:
    with RedisLimiter(r, default_limit=1, max_limit=3) as limiter:
        status = limiter.set_limit("k", 2)
        assert (status.limit, status.override) == (2, 2)
        _held5 = limiter.try_acquire("k")
        _held6 = limiter.try_acquire("k")
        with pytest.raises(TooManyRequests):
            limiter.try_acquire("k")
        assert limiter.set_limit("k", 10).limit == 3  # capped by the max
        _held7 = limiter.try_acquire("k")
        with pytest.raises(TooManyRequests):
            limiter.try_acquire("k")
        cleared = limiter.clear_limit("k")
        assert (cleared.limit, cleared.override, cleared.in_flight) == (1, None, 3)
        # The Rust store's index of overrides is kept too.
        limiter.set_limit("j", 4)
        assert r.hget("inflight:overrides", "j") == b"4"
        assert r.get("inflight:{j}:limit") == b"4"


def test_an_override_no_process_can_read_is_refused_and_read_as_none(r: redis.Redis) -> None:
    """Issue 28, item 10: 2**32 written from Python made every inflight process answer 503 on the key."""
    with RedisLimiter(r, default_limit=1) as limiter:
        for bad in (2**32, 2**64, -1):
            with pytest.raises(ValueError, match="4294967295"):
                limiter.set_limit("k", bad)
        for wrong in (2.5, True, "3"):
            with pytest.raises(TypeError):
                limiter.set_limit("k", wrong)  # type: ignore[arg-type]
        assert r.exists("inflight:{k}:limit", "inflight:overrides") == 0
        assert limiter.set_limit("k", 2**32 - 1).override == 2**32 - 1
        # The script refuses what it could not read back, whoever calls it.
        keys, args = _core.status_call("inflight:", "k", limiter.policy.limits("k"), str(2**32))
        with pytest.raises(redis.ResponseError, match="4294967295"):
            limiter._status(keys=keys, args=args)
        assert r.get("inflight:{k}:limit") == str(2**32 - 1).encode()
        # What another writer left out of range reads as none: the class's limit applies.
        for stored in (str(2**32), str(2**64), "-3", "2.5", "many"):
            r.set("inflight:{k}:limit", stored)
            status = limiter.status("k")
            assert (status.limit, status.override) == (1, None), stored
            with limiter.try_acquire("k"), pytest.raises(TooManyRequests):
                limiter.try_acquire("k")


def test_classes_of_keys(r: redis.Redis) -> None:
    rules = [{"keys": "tenant:*", "default": 2, "max": 3}, {"keys": "app:*", "default": 1}]
    with RedisLimiter(r, limits=rules) as limiter:
        assert limiter.status("tenant:a").limit == 2
        assert limiter.status("app:x").limit == 1
        assert limiter.status("user:1").limit is None
        _held8 = limiter.try_acquire("app:x")
        with pytest.raises(TooManyRequests):
            limiter.try_acquire("app:x")
        assert limiter.set_limit("tenant:a", 9).limit == 3
        # Unlimited keys record nothing, and an override makes them limited.
        free = limiter.try_acquire("user:1")
        assert free.limit is None and not free.held
        assert r.exists("inflight:{user:1}:leases") == 0
        limiter.set_limit("user:1", 1)
        _held9 = limiter.try_acquire("user:1")
        with pytest.raises(TooManyRequests):
            limiter.try_acquire("user:1")


def test_try_acquire_all_is_atomic(r: redis.Redis) -> None:
    with RedisLimiter(r, default_limit=5) as limiter:
        limiter.set_limit("tenant:acme", 1)
        keys = ["app:chat", "tenant:acme", "global", "app:chat"]
        a = limiter.try_acquire_all(keys)
        assert a.keys == ("app:chat", "tenant:acme", "global")
        with pytest.raises(TooManyRequests) as refused:
            limiter.try_acquire_all(["app:search", "tenant:acme", "global"])
        assert refused.value.key == "tenant:acme"
        assert in_flight(limiter, "app:search") == 0
        assert in_flight(limiter, "global") == 1
        a.release()
        assert [in_flight(limiter, k) for k in ("app:chat", "tenant:acme", "global")] == [0, 0, 0]
        with pytest.raises(ValueError):
            limiter.try_acquire_all([f"k{i}" for i in range(17)])
        with pytest.raises(ValueError):
            limiter.try_acquire_all([])


def test_a_permit_garbage_collected_unreleased_is_released(limiter: RedisLimiter) -> None:
    limiter.try_acquire("k")  # dropped at once
    permit = limiter.try_acquire("k")
    del permit
    gc.collect()
    assert wait_for(lambda: in_flight(limiter, "k") == 0)


def stream(n: int, fail_at: int | None = None) -> Iterator[int]:
    for i in range(n):
        if i == fail_at:
            raise ValueError("broken stream")
        yield i


def test_guard_stream_releases_on_exhaustion(limiter: RedisLimiter) -> None:
    guarded = limiter.guard_stream(limiter.try_acquire("k"), stream(3))
    assert in_flight(limiter, "k") == 1
    assert list(guarded) == [0, 1, 2]
    assert in_flight(limiter, "k") == 0


def test_guard_stream_releases_on_an_error(limiter: RedisLimiter) -> None:
    guarded = limiter.guard_stream(limiter.try_acquire("k"), stream(3, fail_at=1))
    with pytest.raises(ValueError):
        list(guarded)
    assert in_flight(limiter, "k") == 0


def test_guard_stream_releases_when_closed_midway(limiter: RedisLimiter) -> None:
    closed = []

    def source() -> Iterator[int]:
        try:
            yield from range(10)
        finally:
            closed.append(True)

    guarded = limiter.guard_stream(limiter.try_acquire("k"), source())
    assert next(guarded) == 0
    guarded.close()
    assert closed == [True]
    assert in_flight(limiter, "k") == 0
    with pytest.raises(StopIteration):
        next(guarded)


def test_guard_stream_releases_when_closed_before_the_first_item(limiter: RedisLimiter) -> None:
    guarded = limiter.guard_stream(limiter.try_acquire("k"), stream(3))
    guarded.close()
    assert in_flight(limiter, "k") == 0


def test_guard_stream_releases_on_generator_exit_of_its_consumer(limiter: RedisLimiter) -> None:
    def consumer() -> Iterator[int]:
        yield from limiter.guard_stream(limiter.try_acquire("k"), stream(5))

    outer = consumer()
    assert next(outer) == 0
    outer.close()  # GeneratorExit at the yield from
    assert in_flight(limiter, "k") == 0


def test_renewal_keeps_a_2s_lease_alive_for_7s(r: redis.Redis) -> None:
    with RedisLimiter(r, default_limit=1, lease=2.0) as limiter:
        permit = limiter.try_acquire("k")
        first_expiry = permit.expires_at_ms
        time.sleep(7)
        assert permit.held
        assert in_flight(limiter, "k") == 1
        assert (permit.expires_at_ms or 0) > (first_expiry or 0) + 4000
        with pytest.raises(TooManyRequests):
            limiter.try_acquire("k")
        permit.release()
        limiter.try_acquire("k").release()


def test_a_lease_shorter_than_its_renewal_can_serve_is_refused(r: redis.Redis) -> None:
    """Issue 28, item 7: leases from 1 ms were accepted, and lapsed while held; 100 ms is the least."""
    with pytest.raises(ValueError, match="100 ms"):
        RedisLimiter(r, default_limit=1, lease=0.05)
    with RedisLimiter(r, default_limit=1) as limiter:
        for short in (0.001, 0.099):
            with pytest.raises(ValueError, match="100 ms"):
                limiter.try_acquire("k", lease=short)
        assert in_flight(limiter, "k") == 0
        limiter.try_acquire("k", lease=0.1).release()
    RedisLimiter(r, default_limit=1, layout="dify", dify_stale_after=0.001).close()  # an age, not a lease


def test_a_lease_the_store_lost_is_readded(r: redis.Redis) -> None:
    with RedisLimiter(r, default_limit=1, lease=0.3) as limiter:
        permit = limiter.try_acquire("k", weight=1)
        r.delete("inflight:{k}:leases", "inflight:{k}:permits")
        assert wait_for(lambda: in_flight(limiter, "k") == 1, 2)
        assert permit.held


def test_close_stops_the_renewer_thread(r: redis.Redis) -> None:
    limiter = RedisLimiter(r, default_limit=1)
    permit = limiter.try_acquire("k")
    threads = [t for t in threading.enumerate() if t.name == "inflight-renewer"]
    assert threads and all(t.daemon for t in threads)
    limiter.close()
    assert wait_for(lambda: not any(t.is_alive() for t in threads), 5)
    permit.release()
    assert in_flight(limiter, "k") == 0
    with pytest.raises(RuntimeError):
        limiter.try_acquire("k")  # refused before Redis is asked: no slot without a renewer


def test_a_killed_holders_slot_comes_back_within_its_lease(r: redis.Redis, redis_url: str) -> None:
    holder = textwrap.dedent(
        f"""
        import sys, time, redis
        from inflight_client import RedisLimiter
        limiter = RedisLimiter(redis.Redis.from_url({redis_url!r}), default_limit=1, lease=2.0)
        permit = limiter.try_acquire("held")
        print("held", flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"held"
        with RedisLimiter(r, default_limit=1) as limiter:
            time.sleep(2.5)  # renewed past its first lease while alive
            with pytest.raises(TooManyRequests):
                limiter.try_acquire("held")
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            killed = time.monotonic()

            def admitted() -> bool:
                try:
                    limiter.try_acquire("held").release()
                    return True
                except TooManyRequests:
                    return False

            assert wait_for(admitted, 4)
            assert time.monotonic() - killed < 2.0 + 1.5
    finally:
        proc.kill()
        proc.wait()
