"""The examples of docs/python.md (clients/python/examples), run as documented: the FastAPI one under
uvicorn, the Flask one under gunicorn with gevent workers, each against a real redis-server. This process
takes the tenant's four slots itself, so a request of the example's waits in the key's queue (its
``max_wait``) until one of them is released."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from middleware_support import (
    EXAMPLES,
    Exchange,
    Server,
    eventually,
    gunicorn,
    queued,
    request,
    running,
    uvicorn,
)

from inflight_client import RedisLimiter

DOC = EXAMPLES.parent.parent.parent / "docs" / "python.md"


def waits_for_a_slot_then_streams(server: Server, r: redis.Redis) -> None:
    assert request(server.port, "/health")[0] == 200
    with RedisLimiter(r, default_limit=4) as mine:
        held = [mine.try_acquire("tenant:acme") for _ in range(4)]
        client = Exchange(server.port, "/v1/events", {"X-Tenant": "acme"})
        eventually(lambda: queued(r, "tenant:acme") == 1, "the example's request waits for a slot")
        held.pop().release()
        answer = client.rest()
        assert answer.startswith(b"HTTP/1.1 200") and b"data: 2" in answer, answer
        eventually(lambda: mine.status("tenant:acme").in_flight == 3, "the example released its slot")
        for permit in held:
            permit.release()
        status, _, body = request(server.port, "/v1/events")  # tenant:anonymous
        assert status == 200 and b"data: 0" in body
        eventually(lambda: mine.status("tenant:anonymous").in_flight == 0, "released")


def test_the_fastapi_example(redis_url: str, r: redis.Redis, tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    env = {"REDIS_URL": redis_url}
    with running(lambda port: uvicorn("fastapi_app:app", port), env, EXAMPLES, tmp_path, "/health") as server:
        waits_for_a_slot_then_streams(server, r)


def test_the_flask_example_under_gevent_workers(redis_url: str, r: redis.Redis, tmp_path: Path) -> None:
    pytest.importorskip("flask")
    pytest.importorskip("gevent")
    env = {"REDIS_URL": redis_url}
    command = lambda port: gunicorn("flask_app:app", port, "gevent")  # noqa: E731
    with running(command, env, EXAMPLES, tmp_path, "/health") as server:
        waits_for_a_slot_then_streams(server, r)


def test_the_guide_shows_the_examples_as_they_are() -> None:
    guide = DOC.read_text()
    for example in ("fastapi_app.py", "flask_app.py"):
        assert (EXAMPLES / example).read_text() in guide, f"docs/python.md does not show examples/{example}"
