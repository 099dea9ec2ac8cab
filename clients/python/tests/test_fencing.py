"""Fencing tokens from Python: on every permit (Redis, asyncio and HTTP limiters), growing on a key across
Rust and Python, and named by releases and renewals so that a late release of an earlier admission of an
id leaves a later one's lease."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

from inflight_client import AsyncRedisLimiter, HttpLimiter, RedisLimiter, TooManyRequests, _keys


def test_tokens_grow_and_a_late_release_leaves_the_later_admission(limiter: RedisLimiter) -> None:
    first = limiter.try_acquire("job-key", id="job-7")
    assert first.token > 0
    first.release()
    second = limiter.try_acquire("job-key", id="job-7")
    assert second.token > first.token
    # The first admission's release again (late, or retried): the later lease stays, counted.
    assert limiter.release("job-key", "job-7", token=first.token) is False
    assert limiter.status("job-key").in_flight == 1
    assert limiter.release("job-key", "job-7", token=second.token) is True
    assert limiter.status("job-key").in_flight == 0


def test_a_generated_ids_lease_records_no_token_a_given_ones_does(
    limiter: RedisLimiter, r: redis.Redis
) -> None:
    _, permits, _ = _keys.names(limiter.prefix, "fresh")
    generated = limiter.try_acquire("fresh")
    assert r.hget(permits, _keys.member(generated.id)) is None  # no other admission used the id
    assert r.hget(permits, "#") == str(generated.token).encode()  # the key's last token is kept
    given = limiter.try_acquire("fresh", id="job-1")
    entry = r.hget(permits, _keys.member(given.id))
    assert entry is not None and entry.endswith(b" %d" % given.token)
    generated.release()
    given.release()
    assert limiter.status("fresh").in_flight == 0
    assert r.hget(permits, _keys.member(given.id)) is None


def test_permits_of_one_id_in_a_process_release_with_the_latest_token(limiter: RedisLimiter) -> None:
    first = limiter.try_acquire("shared", id="request-1")
    second = limiter.try_acquire("shared", id="request-1")
    assert second.token > first.token  # the later admission took the lease over
    second.release()
    assert limiter.status("shared").in_flight == 1  # the first still holds it
    first.release()  # the last holder: released by the latest token
    assert limiter.status("shared").in_flight == 0


@pytest.mark.parametrize(
    ("token", "error"),
    [(-1, ValueError), (2**63, ValueError), (1.5, TypeError), (True, TypeError), ("7", TypeError)],
)
def test_a_token_that_is_no_token_is_an_argument_error(
    limiter: RedisLimiter, token: Any, error: type[Exception]
) -> None:
    with pytest.raises(error):
        limiter.release("k", "id", token=token)


def test_rust_and_python_tokens_grow_on_one_key(
    inflight: Path, redis_url: str, limiter: RedisLimiter
) -> None:
    before = limiter.try_acquire("bench-0")
    before.release()
    # Permits taken and given back by the Rust binary on the same key (inflight bench's "bench-0").
    subprocess.run(
        [str(inflight), "bench", "--store", redis_url, "--tasks", "1", "--limit", "4", "--keys", "1",
         "--duration", "200ms", "--redis-prefix", "inflight:"],
        check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    after = limiter.try_acquire("bench-0")
    assert after.token > before.token
    after.release()


def test_the_asyncio_limiter_names_tokens_too(redis_url: str) -> None:
    async def main() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        limiter = AsyncRedisLimiter(client, default_limit=1)
        try:
            first = await limiter.try_acquire("a-key", id="x")
            await first.release()
            second = await limiter.try_acquire("a-key", id="x")
            assert second.token > first.token
            assert await limiter.release("a-key", "x", token=first.token) is False
            with pytest.raises(TooManyRequests):
                await limiter.try_acquire("a-key")
            await second.release()
            assert (await limiter.status("a-key")).in_flight == 0
        finally:
            await limiter.close()
            await client.aclose()

    asyncio.run(main())


def test_the_http_limiter_gets_and_names_tokens(serve_factory: Any) -> None:
    serve = serve_factory("--default-limit", "1")
    http = HttpLimiter(serve.url, lease=5.0)
    try:
        first = http.try_acquire("h", id="job")
        first.release()
        second = http.try_acquire("h", id="job")
        assert second.token > first.token > 0
        assert http.release("h", "job", token=first.token)  # answered 204, but nothing of the later one
        with pytest.raises(TooManyRequests):
            http.try_acquire("h")
        second.release()
        assert http.status("h").in_flight == 0
    finally:
        http.close()
