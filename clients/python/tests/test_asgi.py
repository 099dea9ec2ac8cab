"""``inflight_client.asgi.InflightMiddleware`` in a Starlette app under a real uvicorn, against a real
redis-server (``AsyncRedisLimiter``) and a real ``inflight serve`` (``HttpLimiter``), with clients on raw
sockets. The app (tests/apps/mw_asgi.py) blocks where the test says until the test lets it go (a Redis
list), so nothing here depends on timing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from middleware_support import (
    APPS,
    Exchange,
    Server,
    calls,
    eventually,
    eventually_value,
    go,
    new_key,
    new_rid,
    parse,
    queued,
    refusal,
    request,
    running,
    seen,
    stream,
    uvicorn,
)
from test_holders import call, listing, quote, revoke_waiter, served, subscribed

from inflight_client import AsyncRedisLimiter, HttpLimiter, RedisLimiter
from inflight_client._refusal import limit_header
from inflight_client.asgi import InflightMiddleware, Message, Receive, Scope, Send


@pytest.fixture(scope="module")
def asgi(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    pytest.importorskip("uvicorn")
    pytest.importorskip("starlette")
    tmp, env = tmp_path_factory.mktemp("asgi"), {"TEST_REDIS_URL": redis_url}
    with running(lambda port: uvicorn("mw_asgi:app", port), env, APPS, tmp) as server:
        yield server


def test_a_stream_holds_its_slot_until_its_last_chunk(
    asgi: Server, r: redis.Redis, counts: RedisLimiter
) -> None:
    key, rid = new_key(), new_rid()
    client = stream(asgi, key, rid)
    assert client.status() == 200
    client.until(b"first")
    assert counts.status(key).in_flight == 1  # the app is blocked mid-stream: the slot is held
    go(r, rid)
    assert b"last" in client.rest()
    eventually(lambda: counts.status(key).in_flight == 0, "the finished stream released its slot")
    assert seen(r, key) == [1]


def test_a_client_leaving_mid_stream_frees_the_slot(
    asgi: Server, r: redis.Redis, counts: RedisLimiter
) -> None:
    key, rid = new_key(), new_rid()
    client = stream(asgi, key, rid, then="forever")
    client.until(b"first")
    client.close()
    # The app is still blocked (no go): Starlette's StreamingResponse heard http.disconnect.
    eventually(lambda: counts.status(key).in_flight == 0, "the left stream released its slot")
    go(r, rid)


def test_an_event_stream_frees_the_slot_when_the_disconnect_arrives(
    asgi: Server, r: redis.Redis, counts: RedisLimiter
) -> None:
    key, rid = new_key(), new_rid()
    client = Exchange(asgi.port, f"/sse?key={key}&rid={rid}")
    client.until(b"data: first")
    assert counts.status(key).in_flight == 1
    client.close()
    eventually(lambda: counts.status(key).in_flight == 0, "http.disconnect released the slot")
    assert not r.exists(f"test:ended:{rid}")  # released before the app returned
    go(r, rid)
    eventually(lambda: bool(r.exists(f"test:ended:{rid}")), "the app returned")
    assert counts.status(key).in_flight == 0


def test_a_client_that_times_out_frees_the_slot_once_the_app_is_done(
    asgi: Server, r: redis.Redis, counts: RedisLimiter
) -> None:
    key, rid = new_key(), new_rid()
    client = Exchange(asgi.port, f"/hang?key={key}&rid={rid}")
    eventually(lambda: calls(r, key) == 1, "the app was called")
    client.sock.settimeout(0.2)
    with pytest.raises(TimeoutError):
        client.until(b"HTTP/1.1")  # the app answers nothing until it is let go
    client.close()
    assert counts.status(key).in_flight == 1  # the app still works on it
    go(r, rid)
    eventually(lambda: counts.status(key).in_flight == 0, "the app's answer released the slot")


def test_an_app_that_raises_frees_the_slot(asgi: Server, r: redis.Redis, counts: RedisLimiter) -> None:
    key = new_key()
    assert request(asgi.port, f"/raise?key={key}")[0] == 500
    eventually(lambda: counts.status(key).in_flight == 0, "the failed request released its slot")
    rid = new_rid()
    client = stream(asgi, key, rid, then="raise")
    client.until(b"first")
    go(r, rid)
    assert b"last" not in client.rest()  # the stream broke off
    eventually(lambda: counts.status(key).in_flight == 0, "the broken stream released its slot")
    assert calls(r, key) == 2 and seen(r, key) == [1, 1]


@pytest.mark.parametrize("prefix,key_class", [("app", "default"), ("rule", "rule:*")])
def test_requests_over_the_limit_get_429_with_the_key_its_class_and_its_figures(
    asgi: Server, r: redis.Redis, counts: RedisLimiter, prefix: str, key_class: str
) -> None:
    key = new_key(prefix)
    rids = [new_rid() for _ in range(6)]
    clients = [stream(asgi, key, rid) for rid in rids]  # all sent before any answer is read
    statuses = [client.status() for client in clients]
    assert sorted(statuses) == [200, 200, 429, 429, 429, 429], statuses
    assert counts.status(key).in_flight == 2  # the two streams hold their slots
    for client, status in zip(clients, statuses, strict=True):
        if status == 429:
            code, headers, body = refusal(client.rest())
            assert headers["retry-after"] == "1"
            named = f'key="{key}"; class="{key_class}"; limit=2; in_flight=2'
            assert headers["inflight-limit"] == named
            assert headers["content-type"] == "application/json"
            assert body == {
                "code": "too_many_requests",
                "message": body["message"],
                "status": 429,
                "key": key,
                "class": key_class,
                "limit": 2,
                "in_flight": 2,
            }
            assert list(body) == ["code", "message", "status", "key", "class", "limit", "in_flight"]
    assert calls(r, key) == 2  # the refused requests never reached the app
    for rid in rids:
        go(r, rid)
    for client, status in zip(clients, statuses, strict=True):
        if status == 200:
            assert b"last" in client.rest()
    eventually(lambda: counts.status(key).in_flight == 0, "both streams released their slots")
    assert max(seen(r, key)) <= 2


def test_a_waiter_is_admitted_when_a_stream_ends(asgi: Server, r: redis.Redis, counts: RedisLimiter) -> None:
    key, first, second = new_key(), new_rid(), new_rid()
    counts.set_limit(key, 1)
    holder = stream(asgi, key, first)
    holder.until(b"first")
    waiter = stream(asgi, key, second, wait=True)
    eventually(lambda: queued(r, key) == 1, "the second request waits in the key's queue")
    code, headers, _ = refusal(stream(asgi, key, new_rid()).rest())  # no max_wait: refused at once
    named = f'key="{key}"; class="default"; limit=1; in_flight=1'
    assert (code, headers["inflight-limit"]) == (429, named)
    assert calls(r, key) == 1
    go(r, first)
    held = holder.rest()
    assert b"last" in held and "inflight-limit" not in parse(held)[1]  # admitted without waiting
    assert waiter.status() == 200
    # Admitted after its wait: the response names the key it queued on, as inflight serve's 201 does.
    assert parse(waiter.until(b"first"))[1]["inflight-limit"] == named
    assert queued(r, key) == 0 and counts.status(key).in_flight == 1
    go(r, second)
    assert b"last" in waiter.rest()
    eventually(lambda: counts.status(key).in_flight == 0, "the waiter's stream released its slot")
    assert seen(r, key) == [1, 1]


def test_permits_are_labelled_with_the_holder_and_a_bad_label_is_dropped(
    asgi: Server, r: redis.Redis, counts: RedisLimiter
) -> None:
    key, first, second = new_key(), new_rid(), new_rid()
    labelled = stream(asgi, key, first)  # the client's address
    labelled.until(b"first")
    assert list(listing(r, key)[0].values()) == ["127.0.0.1"]
    unlabelled = Exchange(asgi.port, f"/stream?key={key}&rid={second}&then=end&holder={'x' * 129}")
    assert unlabelled.status() == 200  # admitted all the same, without the label
    unlabelled.until(b"first")
    assert sorted(listing(r, key)[0].values(), key=str) == ["127.0.0.1", None]
    eventually(lambda: "holder label" in asgi.log.read_text(), "the dropped label was logged")
    for rid, client in ((first, labelled), (second, unlabelled)):
        go(r, rid)
        assert b"last" in client.rest()
    eventually(lambda: counts.status(key).in_flight == 0, "both streams released their slots")


def test_a_revoked_waiter_gets_409_revoked(asgi: Server, r: redis.Redis, counts: RedisLimiter) -> None:
    key, first = new_key(), new_rid()
    counts.set_limit(key, 1)
    holder = stream(asgi, key, first)
    holder.until(b"first")
    waiter = Exchange(asgi.port, f"/stream?key={key}&rid={new_rid()}&then=end&wait=1&holder=waiter-1")
    (ticket, label), *_ = eventually_value(lambda: listing(r, key)[1], "the waiter listed")
    assert label == "waiter-1"
    eventually(lambda: subscribed(r, ticket), "the waiter hears its channel")
    assert revoke_waiter(r, key, ticket)
    code, headers, body = refusal(waiter.rest())
    message = "An admin revoked this request's place in the queue."
    assert (code, body) == (409, {"code": "revoked", "message": message, "status": 409, "key": key})
    assert "inflight-limit" not in headers and "retry-after" not in headers
    assert calls(r, key) == 1 and queued(r, key) == 0  # the app never saw it, and it left the queue
    go(r, first)
    assert b"last" in holder.rest()
    eventually(lambda: counts.status(key).in_flight == 0, "the stream released its slot")


@pytest.fixture
def asgi_over_http(
    redis_url: str, serve_factory: Any, tmp_path: Path
) -> Iterator[tuple[Server, HttpLimiter]]:
    """The app with an ``HttpLimiter`` on ``inflight serve`` (limit 1), which keeps its leases and queues
    in the test's Redis."""
    pytest.importorskip("uvicorn")
    serve = serve_factory("--store", redis_url, "--default-limit", "1", "--limit", "rule:*=1")
    env = {"TEST_REDIS_URL": redis_url, "TEST_SERVE_URL": serve.url}
    with running(lambda port: uvicorn("mw_asgi:app", port), env, APPS, tmp_path) as server:
        limiter = HttpLimiter(serve.url)
        yield server, limiter
        limiter.close()


def test_http_limiter_streams_waits_and_refuses(
    asgi_over_http: tuple[Server, HttpLimiter], r: redis.Redis
) -> None:
    server, limiter = asgi_over_http
    key, first, second = new_key(), new_rid(), new_rid()
    holder = stream(server, key, first, then="forever")
    holder.until(b"first")
    assert limiter.status(key).in_flight == 1
    code, headers, body = refusal(stream(server, key, new_rid()).rest())
    # The class and figures of the server's refusal, passed on.
    named = f'key="{key}"; class="default"; limit=1; in_flight=1'
    assert (code, headers["inflight-limit"], headers["retry-after"]) == (429, named, "1")
    assert (body["key"], body["class"], body["limit"], body["in_flight"]) == (key, "default", 1, 1)
    waiter = stream(server, key, second, wait=True)
    eventually(lambda: queued(r, key) == 1, "the second request waits in the key's queue")
    holder.close()  # the holder's client leaves: its slot goes to the waiter
    # The server's 201 named the key it queued on: passed on too.
    assert parse(waiter.until(b"first"))[1]["inflight-limit"] == named
    go(r, second)
    assert b"last" in waiter.rest()
    eventually(lambda: limiter.status(key).in_flight == 0, "every slot released")
    assert seen(r, key) == [1, 1]
    go(r, first)


def test_http_limiter_labels_revokes_and_names_the_class_of_the_servers_rule(
    asgi_over_http: tuple[Server, HttpLimiter], r: redis.Redis
) -> None:
    server, limiter = asgi_over_http
    serve = limiter.base_url
    key, first, second = new_key("rule"), new_rid(), new_rid()
    holder = stream(server, key, first)
    holder.until(b"first")
    (listed,) = served(serve, key)["holders"]
    assert listed["holder"] == "127.0.0.1"
    code, headers, body = refusal(stream(server, key, new_rid()).rest())
    named = f'key="{key}"; class="rule:*"; limit=1; in_flight=1'
    assert (code, headers["inflight-limit"], body["class"]) == (429, named, "rule:*")
    # A waiter revoked through the server's API.
    revoked = Exchange(server.port, f"/stream?key={key}&rid={new_rid()}&then=end&wait=1&holder=waiter-1")
    (waiter,) = eventually_value(lambda: served(serve, key)["waiters"], "the waiter listed")
    assert waiter["holder"] == "waiter-1"
    eventually(lambda: subscribed(r, waiter["ticket"]), "the server hears the ticket's channel")
    status, _ = call(f"{serve}/v1/keys/{quote(key)}/waiters/{quote(waiter['ticket'])}", "DELETE")
    assert status == 204
    code, _, body = refusal(revoked.rest())
    assert (code, body["code"], body["key"]) == (409, "revoked", key)
    # A waiter admitted: the server's 201 named the key and its class.
    admitted = stream(server, key, second, wait=True)
    eventually(lambda: queued(r, key) == 1, "the next waiter waits in the key's queue")
    go(r, first)
    assert b"last" in holder.rest()
    assert parse(admitted.until(b"first"))[1]["inflight-limit"] == named
    go(r, second)
    assert b"last" in admitted.rest()
    eventually(lambda: limiter.status(key).in_flight == 0, "every slot released")
    assert calls(r, key) == 2


def test_holder_must_be_a_callable() -> None:
    limiter = HttpLimiter("http://127.0.0.1:1")
    with pytest.raises(TypeError, match="holder"):
        InflightMiddleware(lambda *_: None, limiter, lambda scope: None, holder="127.0.0.1")  # type: ignore[arg-type]
    limiter.close()


def test_lifespan_and_websocket_scopes_pass_through(redis_url: str, counts: RedisLimiter) -> None:
    """In process: with the key full, a websocket and a lifespan scope still reach the app (no permit
    asked), and an HTTP one is refused."""
    counts.set_limit("app:full", 1)
    held = counts.try_acquire("app:full")
    reached: list[str] = []
    sent: list[Message] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(scope["type"])

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    async def main() -> None:
        async with AsyncRedisLimiter(redis.asyncio.Redis.from_url(redis_url), default_limit=2) as limiter:
            middleware = InflightMiddleware(app, limiter, lambda scope: "app:full")
            for kind in ("websocket", "lifespan", "http"):
                await middleware({"type": kind, "path": "/"}, receive, send)

    asyncio.run(main())
    held.release()
    assert reached == ["websocket", "lifespan"]
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 429
    named = b'key="app:full"; class="default"; limit=1; in_flight=1'
    assert (b"inflight-limit", named) in sent[0]["headers"]


def test_the_limit_header_quotes_keys() -> None:
    assert limit_header('a"b\\c', "a*", 5, 5) == 'key="a\\"b\\\\c"; class="a*"; limit=5; in_flight=5'
    assert limit_header("café%", None, None, None) == 'key=%"caf%c3%a9%25"'
