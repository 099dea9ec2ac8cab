"""AsyncRedisLimiter: the same behaviour on redis.asyncio (run with asyncio.run, no plugin needed)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from inflight_client import AsyncRedisLimiter, TooManyRequests


def run(redis_url: str, body: object, **kwargs: object) -> None:
    async def main() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        await client.flushall()
        limiter = AsyncRedisLimiter(client, **kwargs)  # type: ignore[arg-type]
        try:
            await body(limiter)  # type: ignore[operator]
        finally:
            await limiter.close()
            await client.aclose()

    asyncio.run(main())


async def count(limiter: AsyncRedisLimiter, key: str) -> int:
    return (await limiter.status(key)).in_flight


def test_admits_refuses_and_releases(redis_url: str) -> None:
    async def body(limiter: AsyncRedisLimiter) -> None:
        a = await limiter.try_acquire("k")
        async with await limiter.try_acquire("k", id="req") as b:
            assert b.in_flight == 2 and b.id == "req"
            with pytest.raises(TooManyRequests):
                await limiter.try_acquire("k")
            retry = await limiter.try_acquire("k", id="req")
            assert retry.in_flight == 2
            await retry.release()  # b still holds "req"
            assert await count(limiter, "k") == 2
        assert await count(limiter, "k") == 1
        assert await a.release() is True
        assert await a.release() is False
        assert await count(limiter, "k") == 0
        with pytest.raises(TooManyRequests):
            await limiter.set_limit("k", 1)
            _held1 = await limiter.try_acquire_all(["j", "k"], id="x")
            _held2 = await limiter.try_acquire_all(["j", "k"], id="y")
        assert await count(limiter, "j") == 1

    run(redis_url, body, default_limit=2)


def test_renewal_and_the_finalizer(redis_url: str) -> None:
    async def body(limiter: AsyncRedisLimiter) -> None:
        permit = await limiter.try_acquire("k")
        await asyncio.sleep(1.5)  # three leases of 0.5 s
        assert permit.held and await count(limiter, "k") == 1
        del permit
        gc.collect()
        for _ in range(100):
            if await count(limiter, "k") == 0:
                break
            await asyncio.sleep(0.02)
        assert await count(limiter, "k") == 0

    run(redis_url, body, default_limit=1, lease=0.5)


def test_guard_stream_on_every_path(redis_url: str) -> None:
    async def source(n: int, fail_at: int | None = None) -> AsyncIterator[int]:
        for i in range(n):
            if i == fail_at:
                raise ValueError("broken")
            yield i

    async def body(limiter: AsyncRedisLimiter) -> None:
        items = [i async for i in limiter.guard_stream(await limiter.try_acquire("k"), source(3))]
        assert items == [0, 1, 2] and await count(limiter, "k") == 0

        with pytest.raises(ValueError):
            async for _ in limiter.guard_stream(await limiter.try_acquire("k"), source(3, 1)):
                pass
        assert await count(limiter, "k") == 0

        guarded = limiter.guard_stream(await limiter.try_acquire("k"), source(3))
        assert await guarded.__anext__() == 0
        await guarded.aclose()
        assert await count(limiter, "k") == 0

        guarded = limiter.guard_stream(await limiter.try_acquire("k"), source(3))
        await guarded.aclose()  # before the first item
        assert await count(limiter, "k") == 0

        sync_items = [i async for i in limiter.guard_stream(await limiter.try_acquire("k"), [1, 2])]
        assert sync_items == [1, 2] and await count(limiter, "k") == 0

    run(redis_url, body, default_limit=1)
