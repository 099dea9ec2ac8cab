"""The LiteLLM handler's configuration (``inflight_client.litellm``): limits from the environment and an
optional file, and the Redis LiteLLM already uses."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis.asyncio

SCOPES = ("key", "team", "user", "end_user", "model", "global")
ENV_LIMITS = {"key": "KEY", "team": "TEAM", "user": "USER", "end_user": "END_USER", "model": "MODEL"}
ENV_LIMITS["global"] = "GLOBAL"
CALL_TYPES = "acompletion,completion,atext_completion,text_completion,aresponses,responses,anthropic_messages"


@dataclass
class Settings:
    """The handler's configuration: a default limit per scope (0: none), overrides per scope and value."""

    limits: dict[str, int] = field(default_factory=dict)
    overrides: dict[str, dict[str, int]] = field(default_factory=dict)
    lease: float = 30.0
    max_wait: float = 0.0
    on_redis_error: str = "allow"  # or "deny"
    retry_after: int = 1
    redis_url: str = ""
    prefix: str = ""
    call_types: frozenset[str] = frozenset(CALL_TYPES.split(","))

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Settings:
        """The file ``INFLIGHT_LITELLM_CONFIG`` (JSON, or TOML by its ``.toml`` name) if set, then the
        environment, which wins over it."""
        raw: dict[str, Any] = {}
        path = env.get("INFLIGHT_LITELLM_CONFIG", "")
        if path:
            with open(path, "rb") as f:
                if path.endswith(".toml"):
                    import tomllib  # Python 3.11+

                    raw = tomllib.load(f)
                else:
                    raw = json.load(f)
        s = cls(
            limits={scope: _whole(raw.get("limits", {}).get(scope, 0), scope) for scope in SCOPES},
            overrides={
                scope: {
                    str(v): _whole(n, f"{scope} {v}")
                    for v, n in raw.get("overrides", {}).get(scope, {}).items()
                }
                for scope in SCOPES
            },
            lease=float(raw.get("lease", 30.0)) or 30.0,
            max_wait=float(raw.get("max_wait", 0.0)),
            on_redis_error=str(raw.get("on_redis_error", "allow")),
            retry_after=_whole(raw.get("retry_after", 1), "retry_after"),
            redis_url=str(raw.get("redis_url", "")),
            prefix=str(raw.get("prefix", "")),
            call_types=frozenset(raw.get("call_types", CALL_TYPES.split(","))),
        )
        for scope, name in ENV_LIMITS.items():
            if env.get(f"INFLIGHT_LITELLM_{name}_LIMIT", ""):
                s.limits[scope] = _whole(env[f"INFLIGHT_LITELLM_{name}_LIMIT"], name)
        if env.get("INFLIGHT_LITELLM_LEASE", ""):
            s.lease = float(env["INFLIGHT_LITELLM_LEASE"]) or 30.0
        if env.get("INFLIGHT_LITELLM_MAX_WAIT", ""):
            s.max_wait = float(env["INFLIGHT_LITELLM_MAX_WAIT"])
        s.on_redis_error = env.get("INFLIGHT_LITELLM_ON_REDIS_ERROR", s.on_redis_error)
        s.redis_url = env.get("INFLIGHT_REDIS_URL", s.redis_url)
        s.prefix = env.get("INFLIGHT_LITELLM_PREFIX", s.prefix)
        if env.get("INFLIGHT_LITELLM_CALL_TYPES", ""):
            s.call_types = frozenset(t.strip() for t in env["INFLIGHT_LITELLM_CALL_TYPES"].split(","))
        if s.on_redis_error not in ("allow", "deny"):
            raise ValueError(f"on_redis_error must be 'allow' or 'deny', not {s.on_redis_error!r}")
        if not 0 <= s.max_wait <= 300:
            raise ValueError(f"max_wait must be from 0 to 300 s, not {s.max_wait}")
        return s


def _whole(value: object, what: str) -> int:
    number = int(str(value))
    if number < 0:
        raise ValueError(f"the limit of {what} must be 0 (none) or more, not {number}")
    return number


def redis_client(url: str = "", env: Mapping[str, str] = os.environ) -> Any:
    """A ``redis.asyncio`` client: ``url`` (``redis://``, ``rediss://``, ``unix://``,
    ``redis+sentinel://[user:pass@]host:port,host:port/master[?db=N]``,
    ``redis+cluster://[user:pass@]host:port,host:port``), else LiteLLM's own variables: ``REDIS_URL``,
    ``REDIS_CLUSTER_NODES``, ``REDIS_SENTINEL_NODES`` with ``REDIS_SERVICE_NAME``, or ``REDIS_HOST``,
    ``REDIS_PORT``, ``REDIS_USERNAME``, ``REDIS_PASSWORD``, ``REDIS_SSL``."""
    url = url or env.get("REDIS_URL", "")
    if url:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if "+" not in scheme:
            return redis.asyncio.Redis.from_url(url)
        user, password = unquote(parts.username or ""), unquote(parts.password or "")
        hosts = [_host_port(h) for h in parts.netloc.rpartition("@")[2].split(",") if h]
        ssl = scheme.startswith("rediss")
        if scheme.endswith("+cluster"):
            nodes = [redis.asyncio.cluster.ClusterNode(h, p) for h, p in hosts]
            return redis.asyncio.RedisCluster(
                startup_nodes=nodes, username=user or None, password=password or None, ssl=ssl
            )
        if scheme.endswith("+sentinel"):
            query = parse_qs(parts.query)
            sentinel = redis.asyncio.Sentinel(
                hosts,
                sentinel_kwargs={
                    "username": query.get("sentinel_username", [None])[0],
                    "password": query.get("sentinel_password", [None])[0],
                },
                username=user or None,
                password=password or None,
                ssl=ssl,
                db=int(query.get("db", ["0"])[0]),
            )
            return sentinel.master_for(parts.path.strip("/"))
        raise ValueError(f"unknown Redis URL scheme {parts.scheme!r}")
    password = env.get("REDIS_PASSWORD") or None
    username = env.get("REDIS_USERNAME") or None
    if env.get("REDIS_CLUSTER_NODES"):
        nodes = [
            redis.asyncio.cluster.ClusterNode(n["host"], int(n["port"]))
            for n in json.loads(env["REDIS_CLUSTER_NODES"])
        ]
        return redis.asyncio.RedisCluster(startup_nodes=nodes, username=username, password=password)
    if env.get("REDIS_SENTINEL_NODES"):
        sentinels = [(str(h), int(p)) for h, p in json.loads(env["REDIS_SENTINEL_NODES"])]
        sentinel_password = env.get("REDIS_SENTINEL_PASSWORD") or None
        s = redis.asyncio.Sentinel(
            sentinels, sentinel_kwargs={"password": sentinel_password}, password=password
        )
        return s.master_for(env.get("REDIS_SERVICE_NAME", "mymaster"))
    return redis.asyncio.Redis(
        host=env.get("REDIS_HOST", "localhost"),
        port=int(env.get("REDIS_PORT", "6379")),
        username=username,
        password=password,
        ssl=env.get("REDIS_SSL", "").lower() in ("1", "true", "yes"),
    )


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return (host.strip("[]"), int(port)) if host else (text, 6379)
