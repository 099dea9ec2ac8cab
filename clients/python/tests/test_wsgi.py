"""``inflight_client.wsgi.InflightMiddleware`` around a Flask app under a real gunicorn (sync, gthread and
gevent workers, two or more worker processes), against a real redis-server (``RedisLimiter``) and a real
``inflight serve`` (``HttpLimiter``), with clients on raw sockets. The app (tests/apps/mw_wsgi.py) blocks
where the test says until the test lets it go (a Redis list), so nothing here depends on timing."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from middleware_support import (
    APPS,
    Exchange,
    Server,
    calls,
    eventually,
    eventually_value,
    go,
    gunicorn,
    new_key,
    new_rid,
    parse,
    queued,
    refusal,
    request,
    running,
    seen,
    stream,
)
from test_holders import call, listing, quote, revoke_waiter, served, subscribed

from inflight_client import HttpLimiter, Permit, RedisLimiter
from inflight_client.wsgi import InflightMiddleware


@pytest.fixture(scope="module", params=["sync", "gthread", "gevent"])
def wsgi(
    request: pytest.FixtureRequest, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    pytest.importorskip("gunicorn")
    pytest.importorskip("flask")
    if request.param == "gevent":
        pytest.importorskip("gevent")
    tmp = tmp_path_factory.mktemp(f"wsgi-{request.param}")
    env = {"TEST_REDIS_URL": redis_url}
    with running(lambda port: gunicorn("mw_wsgi:app", port, request.param), env, APPS, tmp) as server:
        yield server


def test_a_stream_holds_its_slot_until_the_response_is_closed(
    wsgi: Server, r: redis.Redis, counts: RedisLimiter
) -> None:
    key, rid = new_key(), new_rid()
    client = stream(wsgi, key, rid)
    assert client.status() == 200
    client.until(b"first")
    assert counts.status(key).in_flight == 1
    go(r, rid)
    assert b"last" in client.rest()
    eventually(lambda: counts.status(key).in_flight == 0, "the finished stream released its slot")
    assert seen(r, key) == [1]


def test_a_client_leaving_mid_stream_frees_the_slot_at_the_next_write(
    wsgi: Server, r: redis.Redis, counts: RedisLimiter
) -> None:
    key, rid = new_key(), new_rid()
    client = stream(wsgi, key, rid, then="forever")
    client.until(b"first")
    client.close()
    go(r, rid)  # the app streams on, endlessly: only the failed writes end it
    eventually(lambda: counts.status(key).in_flight == 0, "the left stream released its slot")


def test_a_client_that_times_out_frees_the_slot_once_the_app_is_done(
    wsgi: Server, r: redis.Redis, counts: RedisLimiter
) -> None:
    key, rid = new_key(), new_rid()
    client = Exchange(wsgi.port, f"/hang?key={key}&rid={rid}")
    eventually(lambda: calls(r, key) == 1, "the app was called")
    client.sock.settimeout(0.2)
    with pytest.raises(TimeoutError):
        client.until(b"HTTP/1.1")
    client.close()
    assert counts.status(key).in_flight == 1  # the app still works on it
    go(r, rid)
    eventually(lambda: counts.status(key).in_flight == 0, "the app's answer released the slot")


def test_an_app_that_raises_or_never_starts_its_response_frees_the_slot(
    wsgi: Server, r: redis.Redis, counts: RedisLimiter
) -> None:
    key = new_key()
    assert request(wsgi.port, f"/raise?key={key}")[0] == 500
    Exchange(wsgi.port, f"/nostart?key={key}").rest()  # whatever the server answers (gunicorn 27: no status)
    eventually(lambda: counts.status(key).in_flight == 0, "the failed requests released their slots")
    rid = new_rid()
    client = stream(wsgi, key, rid, then="raise")
    client.until(b"first")
    go(r, rid)
    assert b"last" not in client.rest()
    eventually(lambda: counts.status(key).in_flight == 0, "the broken stream released its slot")
    assert calls(r, key) == 3 and seen(r, key) == [1, 1, 1]


@pytest.mark.parametrize("prefix,key_class", [("app", "default"), ("rule", "rule:*")])
def test_requests_over_the_limit_get_429_with_the_key_its_class_and_its_figures(
    wsgi: Server, r: redis.Redis, counts: RedisLimiter, prefix: str, key_class: str
) -> None:
    key = new_key(prefix)
    rids = [new_rid() for _ in range(6)]
    clients = [stream(wsgi, key, rid) for rid in rids]
    statuses = [client.status() for client in clients]
    assert sorted(statuses) == [200, 200, 429, 429, 429, 429], statuses
    assert counts.status(key).in_flight == 2
    for client, status in zip(clients, statuses, strict=True):
        if status == 429:
            code, headers, body = refusal(client.rest())
            assert headers["retry-after"] == "1"
            named = f'key="{key}"; class="{key_class}"; limit=2; in_flight=2'
            assert headers["inflight-limit"] == named
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
    assert calls(r, key) == 2
    for rid in rids:
        go(r, rid)
    for client, status in zip(clients, statuses, strict=True):
        if status == 200:
            assert b"last" in client.rest()
    eventually(lambda: counts.status(key).in_flight == 0, "both streams released their slots")
    assert max(seen(r, key)) <= 2


def test_a_waiter_is_admitted_when_a_stream_ends(wsgi: Server, r: redis.Redis, counts: RedisLimiter) -> None:
    key, first, second = new_key(), new_rid(), new_rid()
    counts.set_limit(key, 1)
    holder = stream(wsgi, key, first)
    holder.until(b"first")
    waiter = stream(wsgi, key, second, wait=True)
    eventually(lambda: queued(r, key) == 1, "the second request waits in the key's queue")
    assert calls(r, key) == 1
    go(r, first)
    held = holder.rest()
    assert b"last" in held and "inflight-limit" not in parse(held)[1]  # admitted without waiting
    assert waiter.status() == 200
    # Admitted after its wait: the response names the key it queued on, as inflight serve's 201 does.
    named = f'key="{key}"; class="default"; limit=1; in_flight=1'
    assert parse(waiter.until(b"first"))[1]["inflight-limit"] == named
    go(r, second)
    assert b"last" in waiter.rest()
    eventually(lambda: counts.status(key).in_flight == 0, "the waiter's stream released its slot")
    assert seen(r, key) == [1, 1]


def test_permits_are_labelled_with_the_holder_and_a_bad_label_is_dropped(
    wsgi: Server, r: redis.Redis, counts: RedisLimiter
) -> None:
    key, first, second = new_key(), new_rid(), new_rid()
    labelled = stream(wsgi, key, first)  # REMOTE_ADDR
    labelled.until(b"first")
    assert list(listing(r, key)[0].values()) == ["127.0.0.1"]
    unlabelled = Exchange(wsgi.port, f"/stream?key={key}&rid={second}&then=end&holder={'x' * 129}")
    assert unlabelled.status() == 200  # admitted all the same, without the label
    unlabelled.until(b"first")
    assert sorted(listing(r, key)[0].values(), key=str) == ["127.0.0.1", None]
    eventually(lambda: "holder label" in wsgi.log.read_text(), "the dropped label was logged")
    for rid, client in ((first, labelled), (second, unlabelled)):
        go(r, rid)
        assert b"last" in client.rest()
    eventually(lambda: counts.status(key).in_flight == 0, "both streams released their slots")


def test_a_revoked_waiter_gets_409_revoked(wsgi: Server, r: redis.Redis, counts: RedisLimiter) -> None:
    key, first = new_key(), new_rid()
    counts.set_limit(key, 1)
    holder = stream(wsgi, key, first)
    holder.until(b"first")
    waiter = Exchange(wsgi.port, f"/stream?key={key}&rid={new_rid()}&then=end&wait=1&holder=waiter-1")
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


def test_http_limiter_under_gevent_workers(
    redis_url: str, serve_factory: Any, tmp_path: Path, r: redis.Redis
) -> None:
    pytest.importorskip("gunicorn")
    pytest.importorskip("gevent")
    serve = serve_factory("--store", redis_url, "--default-limit", "1", "--limit", "rule:*=1")
    env = {"TEST_REDIS_URL": redis_url, "TEST_SERVE_URL": serve.url}
    key, rid = new_key(), new_rid()
    with (
        running(lambda port: gunicorn("mw_wsgi:app", port, "gevent"), env, APPS, tmp_path) as server,
        HttpLimiter(serve.url) as limiter,
    ):
        holder = stream(server, key, rid)
        holder.until(b"first")
        code, headers, _ = refusal(stream(server, key, new_rid()).rest())
        named = f'key="{key}"; class="default"; limit=1; in_flight=1'
        assert (code, headers["inflight-limit"]) == (429, named)
        go(r, rid)
        assert b"last" in holder.rest()
        eventually(lambda: limiter.status(key).in_flight == 0, "the stream released its slot")

        # A rule's key: the holder listed by the server, a waiter revoked through its API (409), and a
        # waiter admitted with the key, its class and figures the server's 201 named.
        key, first, second = new_key("rule"), new_rid(), new_rid()
        holder = stream(server, key, first)
        holder.until(b"first")
        (listed,) = served(serve.url, key)["holders"]
        assert listed["holder"] == "127.0.0.1"
        code, headers, body = refusal(stream(server, key, new_rid()).rest())
        named = f'key="{key}"; class="rule:*"; limit=1; in_flight=1'
        assert (code, headers["inflight-limit"], body["class"]) == (429, named, "rule:*")
        revoked = Exchange(server.port, f"/stream?key={key}&rid={new_rid()}&then=end&wait=1&holder=waiter-1")
        (waiter,) = eventually_value(lambda: served(serve.url, key)["waiters"], "the waiter listed")
        assert waiter["holder"] == "waiter-1"
        eventually(lambda: subscribed(r, waiter["ticket"]), "the server hears the ticket's channel")
        status, _ = call(f"{serve.url}/v1/keys/{quote(key)}/waiters/{quote(waiter['ticket'])}", "DELETE")
        assert status == 204
        code, _, body = refusal(revoked.rest())
        assert (code, body["code"], body["key"]) == (409, "revoked", key)
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
        InflightMiddleware(lambda *_: [], limiter, lambda environ: None, holder="127.0.0.1")  # type: ignore[arg-type]
    limiter.close()


def test_the_permit_is_released_exactly_once(counts: RedisLimiter, monkeypatch: pytest.MonkeyPatch) -> None:
    """In process, with a real Redis: close() twice, and an app that raises, each release once."""
    released: list[bool] = []
    release = Permit.release

    def counted(permit: Permit) -> bool:
        done = release(permit)
        released.append(done)
        return done

    monkeypatch.setattr(Permit, "release", counted)

    def app(environ: Any, start_response: Any) -> Iterable[bytes]:
        if environ["PATH_INFO"] == "/raise":
            raise RuntimeError("failed")
        start_response("200 OK", [])
        return iter([b"a", b"b"])

    middleware = InflightMiddleware(app, counts, lambda environ: "app:once")
    response = middleware({"PATH_INFO": "/"}, lambda status, headers, exc_info=None: lambda data: None)
    assert counts.status("app:once").in_flight == 1
    assert list(response) == [b"a", b"b"]
    assert counts.status("app:once").in_flight == 1  # held until closed
    response.close()  # type: ignore[attr-defined]
    response.close()  # type: ignore[attr-defined]
    assert counts.status("app:once").in_flight == 0
    with pytest.raises(RuntimeError):
        middleware({"PATH_INFO": "/raise"}, lambda status, headers, exc_info=None: lambda data: None)
    assert counts.status("app:once").in_flight == 0
    assert released == [True, False, True]
