"""Dify's key layout (``layout="dify"``): ``dify.lua``'s KEYS and ARGV, as ``DifyStore``
sends them from Rust (``crates/inflight/src/store/redis/dify/store.rs``)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from ._core import Arg, Wait
from ._policy import ClassLimits

#: Dify's own age of a stale entry, seconds.
STALE_AFTER = 600.0

#: How long Dify keeps an app's limit in Redis (its SETEX and EXPIRE), seconds.
LIMIT_TTL = 86400


def key_prefix_from_env() -> str:
    """``REDIS_KEY_PREFIX`` as Dify reads it (its settings' field of that name, default empty), normalized as
    Dify normalizes it (surrounding whitespace stripped; empty: no prefix)."""
    return normalize_key_prefix(os.environ.get("REDIS_KEY_PREFIX", ""))


def normalize_key_prefix(prefix: str | None) -> str:
    return (prefix or "").strip()


def with_prefix(name: str, key_prefix: str) -> str:
    """A name as Dify's ``RedisClientWrapper`` (Dify 1.14 and later) sends it from the methods ``RateLimit``
    calls (``hlen``, ``hset``, ``hdel``, ``get``, ``setex``, ``exists``, ``expire``, ``hgetall``):
    ``<prefix>:<name>``, or the name itself without a prefix."""
    key_prefix = normalize_key_prefix(key_prefix)
    return f"{key_prefix}:{name}" if key_prefix else name


def limit_key(key: str, key_prefix: str = "") -> str:
    """The app's limit, where Dify's workers read and write it."""
    return with_prefix(f"dify:rate_limit:{key}:max_active_requests", key_prefix)


def active_key(key: str, key_prefix: str = "") -> str:
    """The app's hash of active requests, where Dify's workers count (``HLEN``) and write (``HSET``)."""
    return with_prefix(f"dify:rate_limit:{key}:active_requests", key_prefix)


def key_names(keys: Sequence[str], key_prefix: str = "") -> list[str]:
    """Four names a key: Dify's hash, inflight's leases and lease lengths beside it, Dify's limit key;
    both of Dify's with ``REDIS_KEY_PREFIX`` as Dify's wrapper puts it, and inflight's after the hash."""
    out: list[str] = []
    for key in keys:
        if "{" in key or "}" in key:
            raise ValueError(f"the Dify layout takes no key with braces: {key!r}")
        hash_name = active_key(key, key_prefix)
        out += [
            hash_name,
            f"{{{hash_name}}}:leases",
            f"{{{hash_name}}}:lease_ms",
            limit_key(key, key_prefix),
        ]
    return out


def args(
    op: str,
    id: str,
    lease_ms: int,
    stale_ms: int,
    extra: str,
    limits: Sequence[ClassLimits],
    wait: Wait | None = None,
) -> list[Arg]:
    """``dify.lua``'s ARGV: operation, request id, clock offset, lease, stale age, ``extra``, terms; a
    waiter's ticket, ``level:flow_weight``, flow, ticket lease and, when a release may hand it the slot
    (one key), ``1``."""
    out: list[Arg] = [op, id, 0, lease_ms, stale_ms, extra]
    out.extend(f"{c.default} {c.max}" for c in limits)
    if wait is not None:
        out.extend([wait.ticket, f"{wait.priority}:1", wait.flow, wait.lease_ms])
        if wait.handoff and len(limits) == 1:
            out.append("1")
    return out
