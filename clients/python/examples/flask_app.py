"""Flask behind inflight's WSGI middleware: at most 4 requests in flight per tenant, across every process
that shares the Redis; a request waits up to 5 s for a slot, and a stream holds its slot until the server
closes its response.

    REDIS_URL=redis://127.0.0.1:6379 gunicorn -k gevent -w 4 flask_app:app
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import redis
from flask import Flask, Response

from inflight_client import RedisLimiter
from inflight_client.wsgi import InflightMiddleware

redis_client = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"))
limiter = RedisLimiter(redis_client, default_limit=4)

app = Flask(__name__)


@app.get("/health")
def health() -> dict[str, str]:
    return {"status": "ok"}


@app.get("/v1/events")
def events() -> Response:
    def stream() -> Iterator[str]:
        for n in range(3):
            yield f"data: {n}\n\n"
            time.sleep(0.05)

    return Response(stream(), mimetype="text/event-stream")


def tenant(environ: dict[str, Any]) -> str | None:
    """The request's key: its tenant (the X-Tenant header). The health check is not limited."""
    if environ["PATH_INFO"] == "/health":
        return None
    return f"tenant:{environ.get('HTTP_X_TENANT', 'anonymous')}"


app.wsgi_app = InflightMiddleware(app.wsgi_app, limiter, key=tenant, max_wait=5)  # type: ignore[method-assign]
