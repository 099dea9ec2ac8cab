"""inflight for LiteLLM's proxy: in-flight limits per API key, team, user, end user, model group and the
whole gateway, shared by every replica through Redis, with no patch to LiteLLM.

In LiteLLM's ``config.yaml``::

    litellm_settings:
      callbacks: inflight_client.litellm.handler

``async_pre_call_hook`` admits a request on every scope that has a limit in one atomic step (or waits for
its turn, ``max_wait``) and refuses with a 429 naming the refusing scope; the slot is held until the
response has ended, released exactly once by whichever hook hears the end first: the ``finally`` of
``async_post_call_streaming_iterator_hook`` (a stream's end, its error, a client that left),
``async_post_call_success_hook`` (non-streams) or ``async_post_call_failure_hook`` (failures), all keyed
by ``data["litellm_call_id"]``. Leases are renewed while a request runs, and a killed replica's slots come
back within one lease. Configuration: environment variables ``INFLIGHT_LITELLM_*`` (docs/litellm.md) and
an optional JSON or TOML file (``INFLIGHT_LITELLM_CONFIG``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import uuid
from collections import Counter
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any

import redis.asyncio
from fastapi import HTTPException
from litellm.integrations.custom_logger import CustomLogger

from ._async import AsyncPermit, AsyncRedisLimiter
from ._errors import InflightError, StoreError, TooManyRequests
from ._litellm_settings import Settings, redis_client
from ._policy import ClassLimits, Policy

__all__ = ["InflightHandler", "Settings", "handler", "redis_client"]

log = logging.getLogger("inflight_client.litellm")

METADATA_FIELD = "inflight_permit"  # the request's permit id, in its metadata
# LiteLLM calls these only when they are in the instance's own class's __dict__ (vars(cls)).
HOOKS = (
    "async_pre_call_hook",
    "async_post_call_streaming_iterator_hook",
    "async_post_call_success_hook",
    "async_post_call_failure_hook",
)


class _Limits(Policy):
    """Each key's limit as the request being admitted found it (LiteLLM's metadata, the file, the defaults):
    the limiter reads it when it admits, and its renewals keep it."""

    def __init__(self) -> None:
        super().__init__()
        self.of: dict[str, int] = {}

    def limits(self, key: str) -> ClassLimits:
        return ClassLimits(self.of.get(key, 0))


def _inflight(meta: object) -> Mapping[str, Any]:
    """The ``inflight`` object of a LiteLLM metadata dict (``{"inflight": {"limit": 5, "priority": 9,
    "flow": "batch", "max_wait": 30}}``), or an empty one."""
    if isinstance(meta, Mapping) and isinstance(meta.get("inflight"), Mapping):
        return meta["inflight"]  # type: ignore[no-any-return]
    return {}


def _metadata(data: Mapping[str, Any]) -> dict[str, Any]:
    """The request's metadata dict, LiteLLM's name for it on the route (made when missing)."""
    name = "litellm_metadata" if "litellm_metadata" in data else "metadata"
    meta = data.get(name)
    if not isinstance(meta, dict):
        meta = {}
        if isinstance(data, dict):
            data[name] = meta
    return meta


def _positive(*values: object) -> int | None:
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _name(value: str) -> str:
    """A scope's value as a key part: hashed when it is long or has control characters."""
    if len(value.encode()) > 160 or any(c < " " or "\x7f" <= c <= "\x9f" for c in value):
        return "sha256:" + hashlib.sha256(value.encode("utf-8", "replace")).hexdigest()
    return value


@dataclass(frozen=True)
class _Admission:
    keys: list[str]
    scopes: dict[str, str]  # key -> scope
    priority: int
    flow: str
    max_wait: float


class InflightHandler(CustomLogger):
    """LiteLLM's callback (``handler``, below, is the one ``config.yaml`` names). A subclass keeps its
    hooks: ``__init_subclass__`` copies them into the subclass's own ``__dict__``, where LiteLLM looks."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for hook in HOOKS:
            if hook not in vars(cls):
                setattr(cls, hook, getattr(cls, hook))

    def __init__(self, settings: Settings | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings if settings is not None else Settings.from_env()
        self._limiter: AsyncRedisLimiter | None = None
        self._policy = _Limits()
        self._held: dict[str, AsyncPermit] = {}  # litellm_call_id -> its permit (whose id is in metadata)
        self.released: Counter[str] = Counter()  # how many releases each path made
        s = self.settings
        log.info(
            "inflight: limits %s, overrides %s, lease %.1f s, max wait %.1f s; on Redis errors: %s",
            {k: v for k, v in s.limits.items() if v},
            {k: v for k, v in s.overrides.items() if v},
            s.lease,
            s.max_wait,
            "admitted without a limit (on_redis_error=allow)"
            if s.on_redis_error == "allow"
            else "refused (503)",
        )

    def limiter(self) -> AsyncRedisLimiter:
        """The limiter, made on first use (importing the module connects to nothing)."""
        if self._limiter is None:
            s = self.settings
            client = redis_client(s.redis_url)
            cluster = isinstance(client, redis.asyncio.RedisCluster)
            # On a cluster every scope's keys share one slot (the prefix's hash tag): one atomic script.
            prefix = s.prefix or ("inflight:{litellm}:" if cluster else "inflight:")
            self._limiter = AsyncRedisLimiter(client, lease=s.lease, prefix=prefix)
            self._limiter.policy = self._policy
        return self._limiter

    def admission(self, auth: Any, data: Mapping[str, Any]) -> _Admission | None:
        """The keys a request is admitted on (the scopes with a limit), and its place in a queue."""
        s = self.settings
        meta, team_meta = getattr(auth, "metadata", None) or {}, getattr(auth, "team_metadata", None) or {}
        mine, team = _inflight(meta), _inflight(team_meta)
        api_key = getattr(auth, "token", None) or getattr(auth, "api_key", None) or ""
        if api_key.startswith("sk-"):  # a raw key (custom auth): only its hash goes to Redis, as LiteLLM's
            api_key = hashlib.sha256(api_key.encode()).hexdigest()
        team_id = getattr(auth, "team_id", None) or ""
        end_user = getattr(auth, "end_user_id", None) or data.get("user") or ""
        candidates = [
            ("key", api_key, _positive(mine.get("limit"), getattr(auth, "max_parallel_requests", None))),
            ("team", team_id, _positive(team.get("limit"), team_meta.get("max_parallel_requests"))),
            ("user", getattr(auth, "user_id", None) or "", None),
            ("end_user", end_user if isinstance(end_user, str) else str(end_user), None),
            ("model", data.get("model") if isinstance(data.get("model"), str) else "", None),
            ("global", "gateway", None),
        ]
        keys: list[str] = []
        scopes: dict[str, str] = {}
        for scope, value, own in candidates:
            if not value:
                continue
            limit = own or s.overrides.get(scope, {}).get(value) or s.limits.get(scope, 0)
            if limit > 0:
                key = f"litellm:{scope}:{_name(value)}" if scope != "global" else "litellm:global"
                keys.append(key)
                scopes[key] = scope
                self._policy.of[key] = limit
        if not keys:
            return None
        if len(self._policy.of) > 100_000:  # refilled by the requests that need them
            self._policy.of = {k: self._policy.of[k] for k in keys}
        priority = _positive(mine.get("priority"), team.get("priority")) or 0
        flow = (
            mine.get("flow") or team.get("flow") or (f"team:{team_id}" if team_id else f"key:{api_key[:16]}")
        )
        try:
            wait = min(max(float(mine.get("max_wait", team.get("max_wait", s.max_wait))), 0.0), 300.0)
        except (TypeError, ValueError):
            wait = s.max_wait
        flow = str(flow).encode()[:256].decode(errors="ignore")  # at most 256 bytes
        return _Admission(keys, scopes, min(priority, 255), flow, wait)

    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: str
    ) -> dict[str, Any] | None:
        call_id = data.get("litellm_call_id")
        if call_type not in self.settings.call_types or not isinstance(call_id, str) or not call_id:
            return data
        admission = self.admission(user_api_key_dict, data)
        if admission is None:
            return data
        if call_id in self._held:  # a client's x-litellm-call-id reused while its first request runs
            raise HTTPException(409, detail={"error": f"inflight: call id {call_id!r} is already in flight"})
        limiter = self.limiter()
        # The permit's id goes into the request's metadata, and a release must find it there: a client may
        # send another request with the same x-litellm-call-id, whose failure must not free this one's slot.
        permit_id = str(uuid.uuid4())
        try:
            if admission.max_wait > 0:
                permit = await limiter.acquire_all(
                    admission.keys,
                    admission.max_wait,
                    id=permit_id,
                    priority=admission.priority,
                    flow=admission.flow,
                )
            else:
                permit = await limiter.try_acquire_all(admission.keys, id=permit_id)
        except TooManyRequests as refused:
            scope = admission.scopes.get(refused.key, "?")
            named = "" if scope in ("key", "global") else f" {refused.key.split(':', 2)[-1]!r}"
            message = (
                f"inflight: too many requests in flight for the {scope}{named} "
                f"({refused.in_flight} of {refused.limit}); retry later"
            )
            log.info("inflight: refused %s on %s", call_id, refused.key)
            raise HTTPException(
                429,
                detail={
                    "error": message,
                    "scope": scope,
                    "limit": refused.limit,
                    "in_flight": refused.in_flight,
                },
                headers={"retry-after": str(self.settings.retry_after)},
            ) from None
        except (StoreError, InflightError, redis.RedisError, OSError) as error:
            if self.settings.on_redis_error == "deny":
                log.error("inflight: Redis failed (%s); refusing %s (on_redis_error=deny)", error, call_id)
                raise HTTPException(
                    503, detail={"error": "inflight: the limiter's Redis is unavailable"}
                ) from None
            log.error(
                "inflight: Redis failed (%s); admitting %s without a limit (on_redis_error=allow)",
                error,
                call_id,
            )
            return data
        if permit.expires_at_ms is not None:
            if call_id in self._held:  # the same call id admitted meanwhile: this one goes back
                await permit.release()
                raise HTTPException(
                    409, detail={"error": f"inflight: call id {call_id!r} is already in flight"}
                )
            _metadata(data)[METADATA_FIELD] = permit_id
            self._held[call_id] = permit
            log.debug("inflight: admitted %s on %s", call_id, admission.keys)
        return data

    async def release(self, data: Mapping[str, Any] | None, path: str) -> bool:
        """Releases the request's slot if it still holds one: True the once it did."""
        if not isinstance(data, Mapping):
            return False
        call_id = data.get("litellm_call_id")
        permit = self._held.get(call_id) if isinstance(call_id, str) else None
        if permit is None or _metadata(data).get(METADATA_FIELD) != permit.id:
            return False
        del self._held[call_id]  # (no await since the look-up: one release)
        self.released[path] += 1
        log.info("inflight: released %s on %s", call_id, path)
        await permit.release()  # never raises; cancelled, the release goes on in a task of the limiter
        return True

    async def async_post_call_streaming_iterator_hook(
        self, user_api_key_dict: Any, response: Any, request_data: dict[str, Any]
    ) -> AsyncGenerator[Any, None]:
        path = "stream_closed"  # closed by LiteLLM (the client left) unless it ends otherwise
        try:
            async for item in response:
                yield item
            path = "stream_end"
        except Exception:
            path = "stream_error"
            raise
        finally:
            await self.release(request_data, path)

    async def async_post_call_success_hook(
        self, data: dict[str, Any], user_api_key_dict: Any, response: Any
    ) -> Any:
        await self.release(data, "success")
        return None

    async def async_post_call_failure_hook(
        self,
        request_data: dict[str, Any],
        original_exception: Exception,
        user_api_key_dict: Any,
        traceback_str: str | None = None,
    ) -> Any:
        await self.release(request_data, "failure")
        return None

    async def close(self) -> None:
        if self._limiter is not None:
            await self._limiter.close()


def _log_to_stderr() -> None:
    """LiteLLM leaves this logger without a handler: its admissions and releases go to stderr
    (``INFLIGHT_LITELLM_LOG_LEVEL``, INFO by default)."""
    if not log.handlers:
        out = logging.StreamHandler(sys.stderr)
        out.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(out)
        log.propagate = False
    log.setLevel(os.environ.get("INFLIGHT_LITELLM_LOG_LEVEL", "INFO").upper())


_log_to_stderr()
handler = InflightHandler()
