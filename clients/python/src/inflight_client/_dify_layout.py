"""Dify's key layout (``layout="dify"``): ``dify.lua``'s KEYS and ARGV, as ``DifyStore``
sends them from Rust (``crates/inflight/src/store/redis/dify/store.rs``)."""

from __future__ import annotations

from collections.abc import Sequence

from ._core import Arg
from ._policy import ClassLimits

#: Dify's own age of a stale entry, seconds.
STALE_AFTER = 600.0


def key_names(keys: Sequence[str]) -> list[str]:
    """Four names a key: Dify's hash, inflight's leases and lease lengths beside it, Dify's limit key."""
    out: list[str] = []
    for key in keys:
        if "{" in key or "}" in key:
            raise ValueError(f"the Dify layout takes no key with braces: {key!r}")
        hash_name = f"dify:rate_limit:{key}:active_requests"
        out += [
            hash_name,
            f"{{{hash_name}}}:leases",
            f"{{{hash_name}}}:lease_ms",
            f"dify:rate_limit:{key}:max_active_requests",
        ]
    return out


def args(
    op: str, id: str, lease_ms: int, stale_ms: int, extra: str, limits: Sequence[ClassLimits]
) -> list[Arg]:
    """``dify.lua``'s ARGV: operation, request id, clock offset, lease, stale age, ``extra``, terms."""
    out: list[Arg] = [op, id, 0, lease_ms, stale_ms, extra]
    out.extend(f"{c.default} {c.max}" for c in limits)
    return out
