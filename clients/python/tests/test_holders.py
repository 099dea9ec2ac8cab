"""Labelled permits, revoked holders and revoked waiters (issue 41), as the Rust library and ``inflight
serve`` list and revoke them: ``holder=`` is stored with a lease and a ticket (``batch.lua``'s flag 16,
never ``lone.lua``), a revoked lease is lost at its holder's next renewal (``permit.lost``,
``wait_lost``) and never added back, and a revoked waiter's acquire ends with :class:`Revoked`.

The Redis-only tests list and revoke with ``holders.lua`` itself (the crate's copy: the client does not
ship it); the others with the real ``inflight serve`` (``GET /v1/keys/{key}/permits``, ``DELETE
.../permits/{id}?revoke=true``, ``DELETE /v1/keys/{key}/waiters/{ticket}``). Nothing waits on luck: each
step polls, bounded, for what the previous one must lead to.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

from inflight_client import (
    AsyncRedisLimiter,
    HttpLimiter,
    InflightError,
    Permit,
    RedisLimiter,
    Revoked,
    TooManyRequests,
    _core,
    _keys,
    _turns,
)

# holders.lua's entry point (the manifest's ``holders``), from the crate: the client ships only the scripts
# it loads.
CRATE_SCRIPTS = Path(__file__).resolve().parents[3] / "crates/inflight/src/store/redis/scripts"
BOUND = 10.0  # seconds: every poll gives up (and fails) after this
LONG_WAIT = 60.0  # a waiter's max_wait: far longer than any bound, so only a revocation ends it in time


def until(condition: Callable[[], Any], what: str, seconds: float = BOUND) -> Any:
    """Polls ``condition`` until it is truthy (its value), failing after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}")
        time.sleep(0.01)


# --- holders.lua, straight on Redis ------------------------------------------------------------------


def holders_script(r: redis.Redis) -> Any:
    files = ("base.lua", "common.lua", "queue.lua", "holders.lua")
    return r.register_script("".join((CRATE_SCRIPTS / name).read_text("utf-8") for name in files))


def _id(member: bytes) -> str:
    """A permit id as Redis stores it, read back (0xFF and a UUID's 16 bytes, or the id's text)."""
    return str(uuid.UUID(bytes=member[1:])) if member[:1] == b"\xff" else member.decode()


def listing(r: redis.Redis, key: str) -> tuple[dict[str, str | None], list[tuple[str, str | None]]]:
    """The key's holders (id -> label) and waiters (ticket, label) in queue order, as holders.lua lists
    them (its first page)."""
    _, holders, waiters = holders_script(r)(keys=list(_keys.names("inflight:", key)), args=[0, "list", "0"])
    labels: dict[str, str | None] = {}
    for i in range(0, len(holders), 4):
        noted = holders[i + 3].decode()
        # HOLDER field: 'admitted_ms label' ('admitted_ms ' for a plain lease once renewed)
        labels[_id(holders[i])] = (noted.split(" ", 1)[1] or None) if " " in noted else None
    queued: list[tuple[str, str | None]] = []
    for i in range(0, len(waiters), 2):
        ticket = waiters[i].decode().split(" ", 2)[2]
        # '@' field: 'since_ms flow_length flow label'
        _since, length, rest = waiters[i + 1].decode().split(" ", 2)
        queued.append((ticket, rest[int(length) :] or None))
    return labels, queued


def revoke(r: redis.Redis, key: str, id: str) -> bool:
    """An admin's revocation of the lease ``id`` (the Rust store's ``Holders::revoke``)."""
    names = list(_keys.names("inflight:", key))
    return bool(holders_script(r)(keys=names, args=[0, "revoke", _keys.member(id)]) == 1)


def revoke_waiter(r: redis.Redis, key: str, ticket: str) -> bool:
    """An admin's revocation of a waiter's ticket (``Holders::revoke_waiter``)."""
    names = list(_keys.names("inflight:", key))
    return bool(holders_script(r)(keys=names, args=[0, "revoke_waiter", ticket]) == 1)


def subscribed(r: redis.Redis, ticket: str) -> bool:
    """Whether the ticket's process listens on its turns channel (a revocation published before it did
    would go unheard)."""
    channel = ticket.rsplit("#", 1)[0]
    return bool(r.pubsub_numsub(channel)[0][1])


def in_flight(r: redis.Redis, key: str) -> int:
    leases, permits, _ = _keys.names("inflight:", key)
    return int(r.zcard(leases)) + int(r.hget(permits, "") or 0)


@pytest.fixture
def short(r: redis.Redis) -> Iterator[RedisLimiter]:
    """A limiter of one slot a key whose permits renew every 0.1 s."""
    limiter = RedisLimiter(r, default_limit=1, lease=0.3)
    yield limiter
    limiter.close()


def test_a_label_is_flag_16_and_its_record_never_goes_to_lone_lua(
    short: RedisLimiter, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = _core.acquire_args(["k"], "id", 1, 300, [short.policy.limits("k")], True, None, "py-worker-1")
    assert args[1] == "a11" and args[-1] == "py-worker-1" and not _core.lone(args)
    wait = _core.Wait("chan#0", 3, "tenant-a", 3000)
    args = _core.acquire_args(["a", "b"], "id", 1, 300, [short.policy.limits("a")] * 2, False, wait, "w")
    assert args[1] == "a12x2" and args[-5:] == ["chan#0", "3:1", "tenant-a", 3000, "w"]
    assert _core.lone(_core.acquire_args(["k"], "id", 1, 300, [short.policy.limits("k")], True))

    lone_calls: list[object] = []
    real_lone = short._lone

    def spy(keys: list[str], args: list[_core.Arg]) -> Any:
        lone_calls.append(args[1])
        return real_lone(keys=keys, args=args)

    monkeypatch.setattr(short, "_lone", spy)
    short.try_acquire("plain").release()
    assert lone_calls == ["a1", "r0"]
    lone_calls.clear()
    permit = short.try_acquire("k", holder="py-worker-1")
    assert lone_calls == []
    assert listing(r, "k")[0] == {permit.id: "py-worker-1"}
    permit.release()
    assert listing(r, "k")[0] == {}


def test_labels_are_listed_with_leases_and_tickets(redis_url: str, r: redis.Redis) -> None:
    one = RedisLimiter(redis.Redis.from_url(redis_url), default_limit=3)
    other = RedisLimiter(redis.Redis.from_url(redis_url), default_limit=3)
    try:
        labelled = one.try_acquire("k", id="req-1", weight=2, holder="10.0.0.7")
        plain = one.try_acquire_all(["k", "j"])
        both = other.try_acquire_all(["j", "i"], holder="é" * 64)  # 128 bytes
        assert listing(r, "k")[0] == {"req-1": "10.0.0.7", plain.id: None}
        assert listing(r, "j")[0] == {plain.id: None, both.id: "é" * 64}
        assert listing(r, "i")[0] == {both.id: "é" * 64}
        # A waiter's label is listed with its ticket.
        ended: list[Permit] = []
        waiter = threading.Thread(target=lambda: ended.append(other.acquire("k", BOUND, holder="waiter-1")))
        waiter.start()
        (ticket, label), *_ = until(lambda: listing(r, "k")[1], "the waiter listed")
        assert label == "waiter-1" and ticket.startswith("inflight:turns:")
        plain.release()
        waiter.join(BOUND)
        assert not waiter.is_alive()
        (admitted,) = ended
        assert listing(r, "k")[0] == {"req-1": "10.0.0.7", admitted.id: "waiter-1"}
        for permit in (labelled, both, admitted):
            permit.release()
        assert listing(r, "k") == ({}, [])
    finally:
        one.close()
        other.close()


def test_a_revoked_holder_is_lost_at_its_next_renewal_and_never_added_back(
    short: RedisLimiter, r: redis.Redis
) -> None:
    permit = short.try_acquire("k", id="job-7", holder="py-worker-1")
    assert not permit.lost and permit.wait_lost(0.01) is False
    assert revoke(r, "k", "job-7")
    assert not revoke(r, "k", "job-7"), "revoked once"
    assert permit.wait_lost(BOUND) is True
    assert permit.lost and not permit.held
    assert in_flight(r, "k") == 0, "its renewal did not take it back"
    # The slot is another's now; the lost permit's release leaves that one alone, under the same id too.
    other = short.try_acquire("k", id="job-7")
    assert other.token > permit.token
    permit.release()
    assert in_flight(r, "k") == 1 and other.held
    with pytest.raises(TooManyRequests):
        short.try_acquire("k")
    other.release()
    assert in_flight(r, "k") == 0


def test_permits_of_one_id_lose_their_lease_together(short: RedisLimiter, r: redis.Redis) -> None:
    """Two permits of one process under one id share one lease: revoked, both are lost, and neither's
    renewal adds it back (the second renewal no longer finds the lease marked revoked)."""
    first = short.try_acquire("k", id="req-1", holder="a")
    second = short.try_acquire("k", id="req-1", holder="a")
    assert revoke(r, "k", "req-1")
    assert first.wait_lost(BOUND) and second.wait_lost(BOUND)
    time.sleep(0.3)  # (three renewal periods: nothing renews them any more)
    assert in_flight(r, "k") == 0
    first.release()
    second.release()


def test_wait_lost_is_false_once_the_permit_can_no_longer_be_lost(redis_url: str, r: redis.Redis) -> None:
    limiter = RedisLimiter(redis.Redis.from_url(redis_url), default_limit=2, lease=0.3)
    try:
        permit = limiter.try_acquire("k", holder="w")
        heard: list[bool] = []
        watcher = threading.Thread(target=lambda: heard.append(permit.wait_lost()))
        watcher.start()
        until(lambda: permit._held is not None and permit._held.watch is not None, "the watcher waits")
        permit.release()
        watcher.join(BOUND)
        assert heard == [False] and not permit.lost
        assert permit.wait_lost() is False  # released: at once
        limiter.set_limit("free", 0)
        unlimited = RedisLimiter(r).try_acquire("free")  # (no limit: nothing held)
        assert unlimited._held is None and unlimited.wait_lost() is False
        kept = limiter.try_acquire("k")
    finally:
        limiter.close()
    assert kept.wait_lost() is False  # closed: renewed no more, so never heard lost


def test_turns_messages_name_turns_revocations_and_slots_handed() -> None:
    heard = list(_turns._turns("3 4! 17 5=1:2:3:4 6=1:2 7=1:x:3:4 x ! ²"))
    assert heard == [(3, False, None), (4, True, None), (17, False, None), (5, False, (1, 2, 3, 4))]


def test_a_revoked_waiter_raises_revoked_and_leaves_the_queue(short: RedisLimiter, r: redis.Redis) -> None:
    held = short.try_acquire("k")
    ended: list[BaseException | object] = []

    def wait() -> None:
        try:
            ended.append(short.acquire("k", LONG_WAIT, priority=3, flow="tenant-a", holder="waiter-1"))
        except BaseException as error:
            ended.append(error)

    waiter = threading.Thread(target=wait)
    waiter.start()
    (ticket, label), *_ = until(lambda: listing(r, "k")[1], "the waiter listed")
    assert label == "waiter-1"
    until(lambda: subscribed(r, ticket), "the waiter hears its channel")
    assert revoke_waiter(r, "k", ticket)
    waiter.join(BOUND)
    assert not waiter.is_alive(), "the revoked wait ended"
    (error,) = ended
    assert isinstance(error, Revoked) and isinstance(error, InflightError) and error.key == "k"
    assert listing(r, "k")[1] == []
    assert not revoke_waiter(r, "k", ticket)
    # The limiter waits on: a new wait takes a new place, and is admitted in its turn.
    again: list[object] = []
    waiter = threading.Thread(target=lambda: again.append(short.acquire("k", BOUND)))
    waiter.start()
    until(lambda: listing(r, "k")[1], "the next waiter listed")
    held.release()
    waiter.join(BOUND)
    assert len(again) == 1


def run_async(redis_url: str, body: Callable[[AsyncRedisLimiter, redis.Redis], Awaitable[None]]) -> None:
    async def main() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        sync = redis.Redis.from_url(redis_url)
        await client.flushall()
        limiter = AsyncRedisLimiter(client, default_limit=1, lease=0.3)
        try:
            await body(limiter, sync)
        finally:
            await limiter.close()
            await client.aclose()
            sync.close()

    asyncio.run(main())


async def until_async(condition: Callable[[], Any], what: str) -> Any:
    """``until`` off the loop, which goes on serving the limiter's tasks meanwhile."""
    return await asyncio.to_thread(until, condition, what)


def test_async_a_revoked_holder_is_lost_and_a_revoked_waiter_raises_revoked(redis_url: str) -> None:
    async def body(limiter: AsyncRedisLimiter, r: redis.Redis) -> None:
        permit = await limiter.try_acquire("k", id="job-7", holder="py-worker-1")
        first_sibling = await limiter.try_acquire("k", id="job-7")
        assert await permit.wait_lost(0.01) is False
        assert await asyncio.to_thread(revoke, r, "k", "job-7")
        assert await asyncio.wait_for(permit.wait_lost(), BOUND) is True
        assert permit.lost and first_sibling.lost
        await asyncio.sleep(0.3)
        assert await asyncio.to_thread(in_flight, r, "k") == 0
        await permit.release()  # harmless
        await first_sibling.release()

        held = await limiter.try_acquire("k")
        waiting = asyncio.create_task(limiter.acquire("k", LONG_WAIT, holder="waiter-1"))
        (ticket, label), *_ = await until_async(lambda: listing(r, "k")[1], "the waiter listed")
        assert label == "waiter-1"
        await until_async(lambda: subscribed(r, ticket), "the waiter hears its channel")
        assert await asyncio.to_thread(revoke_waiter, r, "k", ticket)
        with pytest.raises(Revoked):
            await asyncio.wait_for(waiting, BOUND)
        assert (await asyncio.to_thread(listing, r, "k"))[1] == []
        watch = asyncio.create_task(held.wait_lost())
        await asyncio.sleep(0)
        await held.release()
        assert await asyncio.wait_for(watch, BOUND) is False

    run_async(redis_url, body)


def test_the_dify_layout_checks_a_label_and_keeps_none(r: redis.Redis) -> None:
    """As the Rust store's Dify layout: Dify's hash holds request ids and times only."""
    limiter = RedisLimiter(r, default_limit=1, layout="dify")
    try:
        with pytest.raises(ValueError, match="holder"):
            limiter.try_acquire("app", holder="")
        permit = limiter.try_acquire("app", holder="py-worker-1")
        assert permit.held and b"py-worker-1" not in b"".join(r.dump(k) or b"" for k in r.scan_iter())
        permit.release()
    finally:
        limiter.close()


def test_holder_is_checked_before_any_store_is_asked(redis_url: str) -> None:
    sync = RedisLimiter(redis.Redis(port=1), default_limit=1)  # (nothing listens: never asked)
    http = HttpLimiter("http://127.0.0.1:1")
    try:
        for limiter in (sync, http):
            for bad, error in (
                ("", ValueError),
                ("a" * 129, ValueError),
                ("a\nb", ValueError),
                (b"x", TypeError),
            ):
                with pytest.raises(error, match="holder"):
                    limiter.try_acquire("k", holder=bad)  # type: ignore[arg-type,unused-ignore]
                with pytest.raises(error, match="holder"):
                    limiter.acquire_all(["k"], 5, holder=bad)  # type: ignore[arg-type,unused-ignore]
    finally:
        sync.close()
        http.close()


# --- with inflight serve ----------------------------------------------------------------------------


def call(url: str, method: str = "GET", body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw.strip() else None
    except urllib.error.HTTPError as error:
        raw = error.read()
        return error.code, json.loads(raw) if raw.strip() else None


def quote(text: str) -> str:
    return urllib.parse.quote(text, safe="")


def served(url: str, key: str) -> Any:
    status, page = call(f"{url}/v1/keys/{quote(key)}/permits")
    assert status == 200, page
    return page


def test_serve_lists_a_python_holder_and_its_revocation_is_heard_lost(
    serve_factory: Any, short: RedisLimiter, r: redis.Redis, redis_url: str
) -> None:
    serve = serve_factory("--store", redis_url, "--default-limit", "1")
    permit = short.try_acquire("k", id="job-7", holder="py-worker-1")
    plain = short.try_acquire("two")
    page = served(serve.url, "k")
    (listed,) = page["holders"]
    assert (listed["id"], listed["holder"], listed["token"]) == ("job-7", "py-worker-1", permit.token)
    assert listed["lease_expires_at_ms"] >= listed["admitted_at_ms"]
    assert "holder" not in served(serve.url, "two")["holders"][0]
    plain.release()

    status, _ = call(f"{serve.url}/v1/keys/k/permits/job-7?revoke=true", "DELETE")
    assert status == 204
    assert permit.wait_lost(BOUND) is True
    assert permit.lost and served(serve.url, "k")["holders"] == []
    # The server admits the id again; the lost permit's release leaves that lease alone.
    status, again = call(f"{serve.url}/v1/keys/k/permits", "POST", {"id": "job-7"})
    assert status == 201, again
    permit.release()
    assert [h["id"] for h in served(serve.url, "k")["holders"]] == ["job-7"]
    assert call(f"{serve.url}/v1/keys/k")[1]["in_flight"] == 1


def test_serve_revokes_python_waiters_sync_and_async(
    serve_factory: Any, short: RedisLimiter, r: redis.Redis, redis_url: str
) -> None:
    serve = serve_factory("--store", redis_url, "--default-limit", "1")

    def revoke_served(label: str) -> None:
        page = until(lambda: served(serve.url, "k")["waiters"], "the waiter listed")
        (waiter,) = page
        assert waiter["holder"] == label
        until(lambda: subscribed(r, waiter["ticket"]), "the waiter hears its channel")
        status, answer = call(f"{serve.url}/v1/keys/k/waiters/{quote(waiter['ticket'])}", "DELETE")
        assert status == 204, answer

    held = short.try_acquire("k")
    ended: list[BaseException | object] = []

    def wait() -> None:
        try:
            ended.append(short.acquire("k", LONG_WAIT, holder="py-waiter"))
        except BaseException as error:
            ended.append(error)

    waiter = threading.Thread(target=wait)
    waiter.start()
    revoke_served("py-waiter")
    waiter.join(BOUND)
    assert not waiter.is_alive()
    assert [type(e) for e in ended] == [Revoked]

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        limiter = AsyncRedisLimiter(client, default_limit=1)
        try:
            waiting = asyncio.create_task(limiter.acquire("k", LONG_WAIT, holder="py-async-waiter"))
            await asyncio.to_thread(revoke_served, "py-async-waiter")
            with pytest.raises(Revoked):
                await asyncio.wait_for(waiting, BOUND)
        finally:
            await limiter.close()
            await client.aclose()

    asyncio.run(main())
    assert served(serve.url, "k")["waiters"] == []
    held.release()


def test_http_limiter_labels_its_permits_and_hears_revocations(
    serve_factory: Any, r: redis.Redis, redis_url: str
) -> None:
    serve = serve_factory("--store", redis_url, "--default-limit", "1")
    http = HttpLimiter(serve.url, lease=0.3)
    try:
        permit = http.try_acquire("k", holder="http-client-1")
        (listed,) = served(serve.url, "k")["holders"]
        assert (listed["id"], listed["holder"]) == (permit.id, "http-client-1")
        status, _ = call(f"{serve.url}/v1/keys/k/permits/{quote(permit.id)}?revoke=true", "DELETE")
        assert status == 204
        assert permit.wait_lost(BOUND) is True and permit.lost
        permit.release()  # harmless
        assert call(f"{serve.url}/v1/keys/k")[1]["in_flight"] == 0

        multi = http.try_acquire_all(["a", "b"], holder="http-client-2")
        assert served(serve.url, "b")["holders"][0]["holder"] == "http-client-2"
        ended: list[BaseException | object] = []

        def wait() -> None:
            try:
                ended.append(http.acquire("a", LONG_WAIT, holder="http-waiter"))
            except BaseException as error:
                ended.append(error)

        waiter = threading.Thread(target=wait)
        waiter.start()
        (queued,) = until(lambda: served(serve.url, "a")["waiters"], "the waiter listed")
        assert queued["holder"] == "http-waiter"
        until(lambda: subscribed(r, queued["ticket"]), "the server hears the ticket's channel")
        status, _ = call(f"{serve.url}/v1/keys/a/waiters/{quote(queued['ticket'])}", "DELETE")
        assert status == 204
        waiter.join(BOUND)
        assert not waiter.is_alive()
        (error,) = ended
        assert isinstance(error, Revoked) and error.key == "a"
        multi.release()
    finally:
        http.close()
