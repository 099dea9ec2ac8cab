"""inflight's client: per-key in-flight limits shared with inflight's Rust processes.

``RedisLimiter`` (and ``AsyncRedisLimiter``) run inflight's own Lua scripts on the same Redis, so a
Python process and a Rust process enforce one limit; ``HttpLimiter`` talks to ``inflight serve``.
``inflight_client.dify`` is a drop-in for Dify's ``RateLimit``; ``inflight_client.asgi`` and
``inflight_client.wsgi`` hold a permit per HTTP request for its response's whole life (docs/python.md).
"""

from ._async import AsyncGuardedStream, AsyncPermit, AsyncRedisLimiter
from ._core import KeyStatus
from ._errors import (
    InflightError,
    Revoked,
    StoreError,
    TooManyRequests,
    TooManyWaiters,
    UnexpectedAnswer,
    WeightExceedsLimit,
)
from ._http import HttpError, HttpLimiter
from ._permit import GuardedStream, Permit
from ._policy import ClassLimits, Policy, Rule
from ._redis import RedisLimiter

__all__ = [
    "AsyncGuardedStream",
    "AsyncPermit",
    "AsyncRedisLimiter",
    "ClassLimits",
    "GuardedStream",
    "HttpError",
    "HttpLimiter",
    "InflightError",
    "KeyStatus",
    "Permit",
    "Policy",
    "Rule",
    "RedisLimiter",
    "Revoked",
    "StoreError",
    "TooManyRequests",
    "TooManyWaiters",
    "UnexpectedAnswer",
    "WeightExceedsLimit",
]

__version__ = "0.1.0"
