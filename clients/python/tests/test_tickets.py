"""Waiting with tickets (queue.lua): one queue per key in Redis for every process, as the Rust library's
(crates/inflight/tests/redis/fair.rs). Two limiter instances stand for two processes: each has its own
turns channel and ticket counter. No test sleeps for an outcome: each waits (bounded) for the tickets
Redis holds, and the admissions come one at a time (each admitted waiter records itself, then releases),
so their order is the queue's."""

from __future__ import annotations

import _thread
import asyncio
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable

import pytest
import redis
import redis.asyncio
from redis.cluster import RedisCluster

from inflight_client import AsyncRedisLimiter, RedisLimiter, TooManyRequests, TooManyWaiters
from inflight_client._keys import names

QUEUE = "inflight:{k}:queue"
BOUND = 20.0  # seconds: the longest any test waits for a state it expects


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def tickets(r: redis.Redis, key: str = "k") -> int:
    return int(r.zcard(f"inflight:{{{key}}}:queue"))


def until_tickets(r: redis.Redis, n: int, key: str = "k") -> None:
    until(lambda: tickets(r, key) == n, f"{n} tickets on {key} (now {tickets(r, key)})")


def run_waiters(
    r: redis.Redis,
    starts: list[Callable[[], object]],
    holder: object,
    release: Callable[[], object],
    key: str = "k",
) -> list[int]:
    """Starts each waiter in a thread once the one before holds its ticket, releases the holder, and
    returns the order in which they were admitted (each records itself, then releases)."""
    order: list[int] = []
    errors: list[BaseException] = []

    def wait(i: int) -> None:
        try:
            permit = starts[i]()
            order.append(i)
            permit.release()  # type: ignore[attr-defined]
        except BaseException as error:
            errors.append(error)

    threads = []
    for i in range(len(starts)):
        thread = threading.Thread(target=wait, args=(i,), daemon=True)
        thread.start()
        threads.append(thread)
        until_tickets(r, i + 1, key)
    release()
    for thread in threads:
        thread.join(BOUND)
        assert not thread.is_alive(), "a waiter was never admitted"
    assert errors == []
    return order


def test_waiters_of_two_limiters_are_admitted_in_arrival_order(
    two: list[RedisLimiter], r: redis.Redis
) -> None:
    a, b = two
    holder = a.try_acquire("k")
    starts = [lambda lim=(a, b)[i % 2]: lim.acquire("k", BOUND) for i in range(6)]
    members = []
    order = run_waiters(r, starts, holder, lambda: (members.extend(r.zrange(QUEUE, 0, -1)), holder.release()))
    assert order == list(range(6))
    # The tickets alternated between the two limiters' channels, each counting its own.
    channels = [m.decode().split(" ")[2].rsplit("#", 1) for m in members]
    assert [n for _, n in channels] == ["0", "0", "1", "1", "2", "2"]
    assert len({c for c, _ in channels}) == 2
    assert all(c.startswith("inflight:turns:") for c, _ in channels)
    assert tickets(r) == 0
    assert a.status("k").in_flight == 0


def test_a_higher_priority_passes_the_lower_ones(two: list[RedisLimiter], r: redis.Redis) -> None:
    a, b = two
    holder = a.try_acquire("k")
    starts = [lambda: a.acquire("k", BOUND) for _ in range(3)]
    starts.append(lambda: b.acquire("k", BOUND, priority=7))
    starts.append(lambda: a.acquire("k", BOUND, priority=255))
    order = run_waiters(r, starts, holder, holder.release)
    assert order == [4, 3, 0, 1, 2]


def test_a_flow_with_one_waiter_is_served_beside_a_flow_with_thirty(redis_url: str, r: redis.Redis) -> None:
    async def main() -> list[str]:
        clients = [redis.asyncio.Redis.from_url(redis_url) for _ in range(2)]
        a, b = (AsyncRedisLimiter(c, default_limit=1) for c in clients)
        order: list[str] = []

        async def wait(limiter: AsyncRedisLimiter, flow: str) -> None:
            permit = await limiter.acquire("k", BOUND, flow=flow)
            order.append(flow)
            await permit.release()

        async def until_async(n: int) -> None:
            deadline = time.monotonic() + BOUND
            while tickets(r) != n:
                assert time.monotonic() < deadline, (n, tickets(r))
                await asyncio.sleep(0.005)

        try:
            holder = await a.try_acquire("k")
            tasks = [asyncio.create_task(wait(a, "bulk")) for _ in range(30)]
            await until_async(30)
            tasks.append(asyncio.create_task(wait(b, "one")))
            await until_async(31)
            await holder.release()
            await asyncio.wait_for(asyncio.gather(*tasks), BOUND)
            assert tickets(r) == 0
            return order
        finally:
            for limiter in (a, b):
                await limiter.close()
            for client in clients:
                await client.aclose()

    order = asyncio.run(main())
    assert len(order) == 31
    assert order.index("one") < 2, order  # within 2 admissions, not after the other flow's 30


def test_asyncio_waiters_of_two_limiters_are_admitted_in_arrival_order_and_leave_when_cancelled(
    redis_url: str, r: redis.Redis
) -> None:
    async def until_async(n: int) -> None:
        deadline = time.monotonic() + BOUND
        while tickets(r) != n:
            assert time.monotonic() < deadline, (n, tickets(r))
            await asyncio.sleep(0.005)

    async def main() -> list[int]:
        clients = [redis.asyncio.Redis.from_url(redis_url) for _ in range(2)]
        a, b = (AsyncRedisLimiter(c, default_limit=1) for c in clients)
        order: list[int] = []

        async def wait(limiter: AsyncRedisLimiter, i: int) -> None:
            permit = await limiter.acquire("k", BOUND)
            order.append(i)
            await permit.release()

        try:
            holder = await a.try_acquire("k")
            tasks = []
            for i in range(6):
                tasks.append(asyncio.create_task(wait((a, b)[i % 2], i)))
                await until_async(i + 1)
            await holder.release()
            await asyncio.wait_for(asyncio.gather(*tasks), BOUND)
            assert tickets(r) == 0

            # A waiter cancelled (an ASGI server cancels the handler of a client that left) leaves the
            # queue; one that times out has left it when its TooManyRequests comes.
            holder = await a.try_acquire("k")
            waiting = asyncio.create_task(b.acquire("k", BOUND))
            await until_async(1)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            await until_async(0)
            with pytest.raises(TooManyRequests) as timed_out:
                await b.acquire("k", 0.2)
            assert type(timed_out.value) is TooManyRequests
            assert (timed_out.value.key, timed_out.value.limit, timed_out.value.in_flight) == ("k", 1, 1)
            assert tickets(r) == 0
            await holder.release()
            assert (await a.status("k")).in_flight == 0
            return order
        finally:
            for limiter in (a, b):
                await limiter.close()
            for client in clients:
                await client.aclose()

    assert asyncio.run(main()) == list(range(6))


def test_a_waiter_that_times_out_or_is_interrupted_leaves_no_ticket(
    two: list[RedisLimiter], r: redis.Redis
) -> None:
    a, b = two
    holder = a.try_acquire("k")
    started = time.monotonic()
    with pytest.raises(TooManyRequests) as refused:
        b.acquire("k", 0.3)
    assert time.monotonic() - started >= 0.3
    assert type(refused.value) is TooManyRequests
    assert tickets(r) == 0  # given up before the refusal came

    # Interrupted (KeyboardInterrupt in the main thread, as Ctrl-C): the renewal thread gives it up.
    def interrupt() -> None:
        until_tickets(r, 1)
        _thread.interrupt_main()

    interrupter = threading.Thread(target=interrupt, daemon=True)
    interrupter.start()
    with pytest.raises(KeyboardInterrupt):
        b.acquire("k", BOUND)
    interrupter.join(BOUND)
    until_tickets(r, 0)
    holder.release()
    assert b.acquire("k", 1.0).release()  # the key and the limiter still work
    assert a.status("k").in_flight == 0


def test_several_keys_queue_on_the_one_that_refuses(two: list[RedisLimiter], r: redis.Redis) -> None:
    a, b = two
    holder = a.try_acquire("full")
    done: list[object] = []
    thread = threading.Thread(target=lambda: done.append(b.acquire_all(["free", "full"], BOUND)), daemon=True)
    thread.start()
    until_tickets(r, 1, "full")
    assert tickets(r, "free") == 0
    assert a.status("free").in_flight == 0  # waiting holds no slot
    holder.release()
    thread.join(BOUND)
    assert len(done) == 1
    assert tickets(r, "full") == 0
    assert a.status("free").in_flight == 1 and a.status("full").in_flight == 1
    done[0].release()  # type: ignore[attr-defined]
    assert a.status("full").in_flight == 0


def test_a_queue_at_its_bound_refuses_with_too_many_waiters(two: list[RedisLimiter], r: redis.Redis) -> None:
    a, b = two
    holder = a.try_acquire("k")
    # queue.lua's bound, 10,000 tickets, made by hand (members as the script writes them).
    with r.pipeline(transaction=False) as pipe:
        for n in range(10_000):
            pipe.zadd(QUEUE, {f"ff0000000000{n + 1:010x} 1 nobody#{n}": 0})
        pipe.execute()
    with pytest.raises(TooManyWaiters) as refused:
        b.acquire("k", 5.0)
    assert isinstance(refused.value, TooManyRequests)  # a 429 as well
    assert (refused.value.key, refused.value.key_class) == ("k", "default")
    assert tickets(r) == 10_000  # nothing queued
    holder.release()


def test_gevent_waiters_are_admitted_in_arrival_order_and_leave_when_killed(redis_url: str) -> None:
    pytest.importorskip("gevent")
    program = textwrap.dedent(
        f"""
        from gevent import monkey
        monkey.patch_all()
        import time
        import gevent, redis
        from inflight_client import RedisLimiter

        client = redis.Redis.from_url({redis_url!r})
        client.flushall()
        a, b = (RedisLimiter(redis.Redis.from_url({redis_url!r}), default_limit=1) for _ in range(2))

        def until(n):
            deadline = time.monotonic() + {BOUND}
            while client.zcard({QUEUE!r}) != n:
                assert time.monotonic() < deadline, (n, client.zcard({QUEUE!r}))
                gevent.sleep(0.005)

        order = []

        def wait(limiter, i):
            permit = limiter.acquire("k", {BOUND})
            order.append(i)
            permit.release()

        holder = a.try_acquire("k")
        jobs = []
        for i in range(6):
            jobs.append(gevent.spawn(wait, (a, b)[i % 2], i))
            until(i + 1)
        holder.release()
        gevent.joinall(jobs, timeout={BOUND}, raise_error=True)
        assert order == list(range(6)), order
        until(0)

        # A greenlet killed while it waits, and one that a gevent.Timeout ends, leave the queue.
        holder = a.try_acquire("k")
        killed = gevent.spawn(b.acquire, "k", {BOUND})
        until(1)
        killed.kill()
        until(0)

        def bounded():
            with gevent.Timeout(5):
                b.acquire("k", {BOUND})

        timed = gevent.spawn(bounded)
        until(1)
        timed.join({BOUND})
        assert isinstance(timed.exception, gevent.Timeout), timed.exception
        until(0)
        holder.release()
        a.close()
        b.close()
        print("ok", flush=True)
        """
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == "ok"


def test_turns_are_heard_across_a_cluster(redis_cluster: list[int]) -> None:
    """On a Redis Cluster, a turn PUBLISHed by the script on the key's node reaches each limiter's
    subscription, whichever node it is made through: keys on two nodes, waiters in arrival order."""
    client = RedisCluster(host="127.0.0.1", port=redis_cluster[0])
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    keys = [f"app-{c}" for c in "abcdef"]
    by_node = {client.get_node_from_key(names("inflight:", k)[0]).name: k for k in keys}  # type: ignore[no-untyped-call]
    assert len(by_node) >= 2
    limiters = [
        RedisLimiter(RedisCluster(host="127.0.0.1", port=port), default_limit=1) for port in redis_cluster[:2]
    ]
    try:
        for key in list(by_node.values())[:2]:
            holder = limiters[0].try_acquire(key)
            starts = [lambda lim=limiters[i % 2], key=key: lim.acquire(key, BOUND) for i in range(4)]
            order = run_waiters(client, starts, holder, holder.release, key)  # type: ignore[arg-type]
            assert order == [0, 1, 2, 3], key
            assert tickets(client, key) == 0  # type: ignore[arg-type]
    finally:
        for limiter in limiters:
            limiter.close()
        client.close()


def test_dify_layout_waiters_queue_beside_difys_hash(redis_url: str, r: redis.Redis) -> None:
    """The Dify layout's waiters take tickets too: their queue is inflight's, beside the hash Dify counts
    (never in it), and two limiters' waiters are admitted in arrival order."""
    a, b = (RedisLimiter(redis.Redis.from_url(redis_url), layout="dify", default_limit=1) for _ in range(2))
    try:
        hash_name = "dify:rate_limit:k:active_requests"
        queue = "{" + hash_name + "}:queue"
        holder = a.try_acquire("k")
        starts = [lambda lim=(a, b)[i % 2]: lim.acquire("k", BOUND) for i in range(4)]
        seen: list[int] = []

        def release() -> None:
            seen.append(int(r.hlen(hash_name)))
            holder.release()

        order: list[int] = []
        threads = []
        for i in range(4):

            def wait(i: int = i) -> None:
                permit = starts[i]()
                order.append(i)
                permit.release()

            thread = threading.Thread(target=wait, daemon=True)
            thread.start()
            threads.append(thread)
            until(lambda i=i: r.zcard(queue) == i + 1, f"{i + 1} tickets beside Dify's hash")
        release()
        for thread in threads:
            thread.join(BOUND)
            assert not thread.is_alive(), "a waiter was never admitted"
        assert order == [0, 1, 2, 3]
        assert seen == [1], "only the holder's entry in Dify's hash while four waited"
        assert r.zcard(queue) == 0
    finally:
        a.close()
        b.close()
