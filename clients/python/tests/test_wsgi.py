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
    go,
    gunicorn,
    new_key,
    new_rid,
    queued,
    refusal,
    request,
    running,
    seen,
    stream,
)

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


def test_requests_over_the_limit_get_429_with_the_key_and_its_figures(
    wsgi: Server, r: redis.Redis, counts: RedisLimiter
) -> None:
    key = new_key()
    rids = [new_rid() for _ in range(6)]
    clients = [stream(wsgi, key, rid) for rid in rids]
    statuses = [client.status() for client in clients]
    assert sorted(statuses) == [200, 200, 429, 429, 429, 429], statuses
    assert counts.status(key).in_flight == 2
    for client, status in zip(clients, statuses, strict=True):
        if status == 429:
            code, headers, body = refusal(client.rest())
            assert headers["retry-after"] == "1"
            assert headers["inflight-limit"] == f'key="{key}"; limit=2; in_flight=2'
            assert body == {
                "code": "too_many_requests",
                "message": body["message"],
                "status": 429,
                "key": key,
                "limit": 2,
                "in_flight": 2,
            }
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
    assert b"last" in holder.rest()
    assert waiter.status() == 200
    waiter.until(b"first")
    go(r, second)
    assert b"last" in waiter.rest()
    eventually(lambda: counts.status(key).in_flight == 0, "the waiter's stream released its slot")
    assert seen(r, key) == [1, 1]


def test_http_limiter_under_gevent_workers(
    redis_url: str, serve_factory: Any, tmp_path: Path, r: redis.Redis
) -> None:
    pytest.importorskip("gunicorn")
    pytest.importorskip("gevent")
    serve = serve_factory("--store", redis_url, "--default-limit", "1")
    env = {"TEST_REDIS_URL": redis_url, "TEST_SERVE_URL": serve.url}
    key, rid = new_key(), new_rid()
    with (
        running(lambda port: gunicorn("mw_wsgi:app", port, "gevent"), env, APPS, tmp_path) as server,
        HttpLimiter(serve.url) as limiter,
    ):
        holder = stream(server, key, rid)
        holder.until(b"first")
        code, headers, _ = refusal(stream(server, key, new_rid()).rest())
        assert (code, headers["inflight-limit"]) == (429, f'key="{key}"; limit=1; in_flight=1')
        go(r, rid)
        assert b"last" in holder.rest()
        eventually(lambda: limiter.status(key).in_flight == 0, "the stream released its slot")


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
