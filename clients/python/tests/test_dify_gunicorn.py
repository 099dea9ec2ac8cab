"""The drop-in under a real gunicorn with gevent workers: as Dify's API runs it (its entrypoint: no
``--preload``, the worker class ``SERVER_WORKER_CLASS``, ``gevent`` in Dify's compose and
``GeventWebSocketWorker`` when unset since 1.14, so ``configure()`` runs in each worker after gevent's
monkey-patching), and with ``--preload -k gevent``, where ``configure()`` runs in the master, before the
fork and the patching."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from conftest import free_port

from inflight_client import RedisLimiter

APP = textwrap.dedent(
    """
    import os

    import redis

    from inflight_client import dify

    # At import: in gunicorn's master with --preload (before the fork, before gevent patches anything),
    # else in each worker, once gevent has patched it.
    dify.configure(redis.Redis.from_url(os.environ["TEST_REDIS_URL"]), lease=float(os.environ["TEST_LEASE"]))


    def app(environ, start_response):
        if environ["PATH_INFO"] == "/ready":
            start_response("200 OK", [("Content-Length", "0")])
            return [b""]
        limit = dify.RateLimit(environ["PATH_INFO"].strip("/"), 2)
        request_id = limit.enter()
        try:
            body = f"{os.getpid()} {request_id}".encode()
        finally:
            limit.exit(request_id)
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]
    """
)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


SHAPES = {
    # Dify's entrypoint (no --preload) with its compose's SERVER_WORKER_CLASS=gevent, and unset (1.14+).
    "difys-compose": ["-k", "gevent", "--worker-connections", "10"],
    "difys-entrypoint": [
        "-k",
        "geventwebsocket.gunicorn.workers.GeventWebSocketWorker",
        "--worker-connections",
        "10",
    ],
    "preload-gevent": ["--preload", "-k", "gevent"],
}


@pytest.fixture(params=sorted(SHAPES))
def gunicorn_app(
    request: pytest.FixtureRequest, tmp_path: Path, redis_url: str, r: redis.Redis
) -> Iterator[str]:
    gunicorn = shutil.which("gunicorn", path=str(Path(sys.executable).parent))
    if gunicorn is None:
        pytest.skip("gunicorn is not installed")
    pytest.importorskip("gevent")
    pytest.importorskip("geventwebsocket")
    (tmp_path / "dify_app.py").write_text(APP)
    port = free_port()
    env = {**os.environ, "TEST_REDIS_URL": redis_url, "TEST_LEASE": "60", "PYTHONPATH": str(tmp_path)}
    log = (tmp_path / "gunicorn.log").open("wb")
    proc = subprocess.Popen(
        [gunicorn, *SHAPES[request.param], "-w", "2", "-b", f"127.0.0.1:{port}", "dify_app:app"],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (tmp_path / "gunicorn.log").read_text()
            try:
                with urllib.request.urlopen(url + "/ready", timeout=5):
                    break
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)  # gunicorn's quick shutdown
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # a worker still booting when the signal came: end them all
            for child in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split():
                os.kill(int(child), signal.SIGKILL)
            proc.kill()
            proc.wait()
        log.close()


def test_gevent_workers_admit_and_release(gunicorn_app: str, r: redis.Redis) -> None:
    answers = [get(f"{gunicorn_app}/app-1") for _ in range(12)]
    assert [status for status, _ in answers] == [200] * 12, answers
    # Every request gave its slot back at once: nothing stays taken for a lease.
    with RedisLimiter(r) as limiter:
        assert limiter.status("app:app-1").in_flight == 0
