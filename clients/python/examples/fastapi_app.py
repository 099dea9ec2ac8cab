"""FastAPI behind inflight's ASGI middleware: at most 4 requests in flight per tenant, across every process
that shares the Redis; a request waits up to 5 s for a slot, and a stream holds its slot until its last
event is sent or its client goes away.

    REDIS_URL=redis://127.0.0.1:6379 uvicorn fastapi_app:app
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis.asyncio
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from inflight_client import AsyncRedisLimiter
from inflight_client.asgi import InflightMiddleware, Scope

redis_client = redis.asyncio.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"))
limiter = AsyncRedisLimiter(redis_client, default_limit=4)


def tenant(scope: Scope) -> str | None:
    """The request's key: its tenant (the X-Tenant header). The health check is not limited."""
    if scope["path"] == "/health":
        return None
    for name, value in scope["headers"]:
        if name == b"x-tenant":
            return f"tenant:{value.decode('latin-1')}"
    return "tenant:anonymous"


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    await limiter.close()  # waits for releases still on their way


app = FastAPI(lifespan=lifespan)
app.add_middleware(InflightMiddleware, limiter=limiter, key=tenant, max_wait=5)


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@app.get("/v1/events")
async def events() -> StreamingResponse:
    async def stream() -> AsyncIterator[str]:
        for n in range(3):
            yield f"data: {n}\n\n"
            await asyncio.sleep(0.05)

    return StreamingResponse(stream(), media_type="text/event-stream")
