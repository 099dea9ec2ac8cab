"""A freed slot handed straight to the head ticket (queue.lua's ``hand_off``), as the Rust library's waiters
are (crates/inflight/tests/waiting): a Python waiter on one key, without an id of its own, asks under an id
of its wait's own; the release that frees the slot records the lease under that id and tells the waiter's
limiter on its turns channel (``<n>=token:expires_at_ms:limit:in_flight``), and the waiter holds the slot
without asking again. Two limiter instances stand for two processes. No test sleeps for an outcome: each
waits (bounded) for the state Redis holds."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio
from test_tickets import BOUND, tickets, until

from inflight_client import AsyncRedisLimiter, Permit, RedisLimiter, TooManyRequests, _core
from inflight_client._keys import member

LEASES, PERMITS = "inflight:{k}:leases", "inflight:{k}:permits"


@pytest.fixture(autouse=True)
def no_recheck(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waiters ask again only when called: the once-a-second re-check, which renews a ticket and would also
    ask, is put past every test's bound, so that the asks counted do not depend on how fast a test runs."""
    monkeypatch.setattr("inflight_client._redis.RECHECK", BOUND)
    monkeypatch.setattr("inflight_client._async.RECHECK", BOUND)


def counted_asks(limiter: Any) -> list[int]:
    """Counts the admissions ``limiter`` sends (its ``_acquire`` calls): a waiter's asks. (Its turns channel
    subscribed first: a wait begun before asks once more once subscribed, in case it missed a turn.)"""
    if isinstance(limiter, RedisLimiter):
        ticket = limiter._turns.take()
        assert limiter._turns.heard(BOUND), "subscribed to its turns"
        limiter._turns.drop(ticket)
    asks = [0]
    ask = limiter._acquire

    def counting(*args: Any, **kwargs: Any) -> Any:
        asks[0] += 1
        return ask(*args, **kwargs)

    limiter._acquire = counting
    return asks


class _Watched(threading.Event):
    """A ticket's turn event that tells when its waiter waits on it."""

    def __init__(self, waiting: threading.Event) -> None:
        super().__init__()
        self.waiting = waiting

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        return super().wait(timeout)


def waits_for_turn(limiter: RedisLimiter) -> threading.Event:
    """Set once a wait of ``limiter`` waits for its turn, its ask answered: a slot handed from then on is
    heard there, and never as its ask comes back (when the waiter asks once more, at once: it takes the
    lease its id holds)."""
    waiting = threading.Event()
    take = limiter._turns.take

    def taking() -> Any:
        ticket = take()
        ticket.called = _Watched(waiting)
        return ticket

    limiter._turns.take = taking  # type: ignore[method-assign]
    return waiting


def handed(holder: RedisLimiter, waiter: RedisLimiter) -> Permit:
    """The permit of ``waiter``, waiting on ``k`` (limit 1) for the slot ``holder`` holds and then releases:
    handed it, having asked once, when it queued."""
    first = holder.try_acquire("k")
    asks, waiting = counted_asks(waiter), waits_for_turn(waiter)
    got: list[Permit] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire("k", max_wait=BOUND)), daemon=True)
    thread.start()
    until(waiting.is_set, "the waiter waiting for its turn")
    first.release()
    thread.join(BOUND)
    assert got, "the waiter was admitted"
    assert asks[0] == 1, "handed the slot: the waiter asked once, when it queued"
    assert got[0].queued_on == "k" and got[0].in_flight == 1
    return got[0]


def test_a_release_hands_the_waiter_the_slot_and_it_does_not_ask_again(
    two: list[RedisLimiter], r: redis.Redis
) -> None:
    holder, waiter = two
    permit = handed(holder, waiter)
    assert permit.limit == 1
    # The release recorded the lease under the wait's id, with the token the waiter was told.
    assert r.zscore(LEASES, member(permit.id)) is not None
    entry = r.hget(PERMITS, member(permit.id))
    assert entry is not None and entry.split()[2] == str(permit.token).encode()
    assert tickets(r) == 0
    # Handed for as long as the ticket would have lasted (3 s), then renewed to the full lease (30 s).
    now_ms = int(time.time() * 1000)
    assert permit.expires_at_ms is not None and permit.expires_at_ms <= now_ms + 3_500
    until(
        lambda: (r.zscore(LEASES, member(permit.id)) or 0) > time.time() * 1000 + 10_000,
        "the handed lease renewed to the full lease",
    )
    with pytest.raises(TooManyRequests):
        holder.try_acquire("k")
    permit.release()
    assert r.zcard(LEASES) == 0


def test_asyncio_waiters_are_handed_the_slot_in_arrival_order(redis_url: str, r: redis.Redis) -> None:
    async def main() -> None:
        holder = RedisLimiter(redis.Redis.from_url(redis_url), default_limit=1)
        limiters = [
            AsyncRedisLimiter(redis.asyncio.Redis.from_url(redis_url), default_limit=1) for _ in range(2)
        ]
        for limiter in limiters:
            ticket = limiter._turns.take()
            await limiter._turns.heard(BOUND)
            assert limiter._turns.is_heard(), "subscribed to its turns"
            limiter._turns.drop(ticket)
        asks = [counted_asks(limiter) for limiter in limiters]
        order: list[int] = []
        try:
            first = holder.try_acquire("k")

            async def wait(i: int) -> None:
                permit = await limiters[i].acquire("k", max_wait=BOUND)
                order.append(i)
                assert permit.queued_on == "k"
                await permit.release()  # hands the next waiter the slot

            tasks = []
            for i in range(2):
                tasks.append(asyncio.create_task(wait(i)))
                deadline = time.monotonic() + BOUND
                while tickets(r) != i + 1:
                    assert time.monotonic() < deadline, "the waiters' tickets"
                    await asyncio.sleep(0.005)
            first.release()
            await asyncio.wait_for(asyncio.gather(*tasks), BOUND)
            assert order == [0, 1]
            assert [a[0] for a in asks] == [1, 1], "each asked once, when it queued"
            assert r.zcard(LEASES) == 0 and tickets(r) == 0
        finally:
            holder.close()
            for limiter in limiters:
                await limiter.close()

    asyncio.run(main())


DIFY_HASH = "dify:rate_limit:k:active_requests"


def test_under_the_dify_layout_a_release_hands_the_waiter_the_slot(redis_url: str, r: redis.Redis) -> None:
    """Dify's layout (dify.lua) hands the slot too: the release writes the waiter's entry in Dify's hash
    (token 0, as every Dify-layout lease), and the waiter holds it without asking again."""
    holder, waiter = (
        RedisLimiter(redis.Redis.from_url(redis_url), default_limit=1, layout="dify") for _ in range(2)
    )
    try:
        permit = handed(holder, waiter)
        assert permit.token == 0
        assert r.hkeys(DIFY_HASH) == [permit.id.encode()]
        assert dify_queue(r) == 0
        permit.release()
        assert r.hlen(DIFY_HASH) == 0
    finally:
        holder.close()
        waiter.close()


def dify_queue(r: redis.Redis) -> int:
    return int(r.zcard(f"{{{DIFY_HASH}}}:queue"))


# Per layout: whether the id holds a lease, and whether nothing is held or queued.
HOLDS: dict[str, tuple[Callable[[redis.Redis, str], bool], Callable[[redis.Redis], bool]]] = {
    "inflight": (
        lambda r, id: r.zscore(LEASES, member(id)) is not None,
        lambda r: r.zcard(LEASES) == 0 and tickets(r) == 0,
    ),
    "dify": (
        lambda r, id: bool(r.hexists(DIFY_HASH, id)),
        lambda r: r.hlen(DIFY_HASH) == 0 and dify_queue(r) == 0,
    ),
}


@pytest.mark.parametrize("layout", ["inflight", "dify"])
def test_a_slot_handed_to_a_wait_that_ended_goes_back_with_its_ticket(
    redis_url: str, r: redis.Redis, layout: str
) -> None:
    """A waiter whose wait ended before it heard of the slot handed to it (timed out, interrupted) gives it
    back when it gives its ticket up: the leave names the wait's id (flags 8; under the Dify layout, a
    release by id once the ticket is found gone)."""
    holds, empty = HOLDS[layout]
    holder, waiter = (
        RedisLimiter(redis.Redis.from_url(redis_url), default_limit=1, layout=layout) for _ in range(2)
    )
    try:
        first = holder.try_acquire("k")
        keys, limits = ("k",), [waiter.policy.limits("k")]
        ticket = waiter._turns.take()
        waiter._turns.drop(ticket)  # (no one hears its turn: its wait is over)
        wait_id, wait = _core.waiting(keys, None, ticket.name, 0, "", 3_000)
        assert wait_id is not None and wait.handoff
        with pytest.raises(_core.Queued):
            waiter._acquire(keys, wait_id, 1, None, limits, wait, None, True)
        first.release()
        assert holds(r, wait_id), "the release handed the ticket the slot"
        waiter._leave(keys, ticket.name, wait_id)
        assert empty(r)
        holder.try_acquire("k").release()
    finally:
        holder.close()
        waiter.close()


def test_no_handoff_with_an_id_of_the_callers_or_on_several_keys(
    two: list[RedisLimiter], r: redis.Redis
) -> None:
    """A waiter with its own id, or on several keys, is called and asks again, as before."""
    holder, waiter = two
    for keys, id in ((["k"], "mine"), (["k", "other"], None)):
        first = holder.try_acquire("k")
        asks = counted_asks(waiter)
        got: list[Permit] = []
        thread = threading.Thread(
            target=lambda: got.append(waiter.acquire_all(keys, max_wait=BOUND, id=id)),  # noqa: B023
            daemon=True,
        )
        thread.start()
        until(lambda: tickets(r) == 1, "the waiter's ticket")
        first.release()
        thread.join(BOUND)
        assert got and asks[0] == 2, "called: it asked again"
        assert id is None or got[0].id == id
        got[0].release()
        del waiter._acquire  # (the class's again)
    assert r.zcard(LEASES) == 0
