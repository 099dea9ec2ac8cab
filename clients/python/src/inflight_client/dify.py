"""A drop-in for Dify's ``core.app.features.rate_limiting.rate_limit.RateLimit``, on inflight's scripts.

Configure once, at start-up (``app_factory`` or an extension's ``init_app``)::

    from extensions.ext_redis import redis_client
    from core.errors.error import AppInvokeQuotaExceededError
    import inflight_client.dify

    inflight_client.dify.configure(redis_client, error=AppInvokeQuotaExceededError)

then import ``RateLimit``, ``RateLimitGenerator`` and ``rate_limit_context`` from ``inflight_client.dify``
where Dify imports them from ``core.app.features.rate_limiting`` (its ``rate_limit_context`` must come from
here too: Dify's exits only when its block succeeds, which leaves a re-entered id held). Each app's
requests are admitted on the key ``app:<app id>`` (``key_format``) with the app's ``max_active_requests``
as its limit (capped by ``max_limit``, and by an override set through inflight), atomically and shared
with every inflight process on the same Redis; a request's slot is renewed while it runs, so a stream of
an hour keeps it, and a crashed worker's slots come back within one lease. ``error`` is the exception
raised at the limit: pass Dify's ``AppInvokeQuotaExceededError`` so that its handlers apply unchanged; by
default it is this module's :class:`AppInvokeQuotaExceededError`, a :class:`~inflight_client.TooManyRequests`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
from redis.cluster import RedisCluster

from . import _dify_layout, _input
from ._errors import StoreError, TooManyRequests
from ._permit import Permit, PerProcess
from ._policy import ClassLimits
from ._redis import RedisLimiter

__all__ = [
    "AppInvokeQuotaExceededError",
    "RateLimit",
    "RateLimitGenerator",
    "configure",
    "rate_limit_context",
]

T = TypeVar("T")


class AppInvokeQuotaExceededError(TooManyRequests):
    """Raised at an app's limit, with Dify's message (Dify's own class is ``core.errors.error``'s; pass it
    to :func:`configure` as ``error`` to raise that one instead)."""

    def __init__(
        self, message: str, limit: int | None = None, in_flight: int | None = None, key: str = ""
    ) -> None:
        super().__init__(limit, in_flight, key)
        self.args = (message,)

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class _Config:
    limiter: RedisLimiter
    key_format: str
    max_limit: int
    error: Callable[[str], BaseException]
    fail_open: bool


@dataclass
class _Holding:
    permit: Permit
    count: int


_config: _Config | None = None
# Per process, made on first use (after a fork, after gevent's monkey-patching): configure() may run in
# gunicorn's master before either (--preload).
_holders: PerProcess[dict[tuple[str, str], _Holding]] = PerProcess(dict)
_lock: PerProcess[threading.Lock] = PerProcess(threading.Lock)


def configure(
    redis_client: redis.Redis | RedisCluster,
    *,
    key_format: str | None = None,
    prefix: str = "inflight:",
    lease: float = 30.0,
    max_limit: int = 0,
    error: Callable[[str], BaseException] | None = None,
    layout: str = "inflight",
    dify_stale_after: float = _dify_layout.STALE_AFTER,
    key_prefix: str | None = None,
    on_store_failure: str = "fail_closed",
) -> RedisLimiter:
    """Sets the Redis client and settings every :class:`RateLimit` uses; returns the limiter (for
    ``status``/``set_limit``). Called again, it replaces them (closing the previous limiter). Safe before or
    after gevent's monkey-patching and before a fork (gunicorn ``--preload``): locks and the renewal thread
    are made in each process when first used.

    ``layout="dify"`` counts in Dify's own keys, shared with Dify workers not yet patched (a migration:
    docs/dify.md); its keys are the app ids themselves (``key_format`` ``"{}"``, else ``"app:{}"``). There,
    ``dify_stale_after`` is the age at which Dify's workers evict an entry (600 s in Dify; an entry's start
    time is its lease's end less it, so that Dify never evicts a live one), and ``key_prefix`` is Dify's
    ``REDIS_KEY_PREFIX``, which Dify (1.14 and later) puts before both of an app's keys: pass Dify's own
    ``dify_config.REDIS_KEY_PREFIX`` (Dify reads it from ``api/.env`` too, which the process environment
    does not carry); ``None`` reads ``REDIS_KEY_PREFIX`` from the process environment.

    ``on_store_failure`` is what ``enter`` does when Redis cannot be reached: ``"fail_closed"`` raises the
    :class:`~inflight_client.StoreError` (Dify answers 500, as its own class does), ``"fail_open"`` admits
    without a limit (``enter`` returns Dify's unlimited id, logged as a warning), as the server's
    ``--on-store-failure`` does."""
    global _config
    _input.limit(max_limit, "max_limit")
    if on_store_failure not in ("fail_closed", "fail_open"):
        raise ValueError(f"on_store_failure must be 'fail_closed' or 'fail_open', not {on_store_failure!r}")
    if key_format is None:
        key_format = "{}" if layout == "dify" else "app:{}"
    if key_prefix is None:
        key_prefix = _dify_layout.key_prefix_from_env()
    limiter = RedisLimiter(
        redis_client,
        lease=lease,
        prefix=prefix,
        layout=layout,
        dify_stale_after=dify_stale_after,
        dify_key_prefix=key_prefix,
        _limits_per_call=True,  # each RateLimit passes its app's limit
    )
    with _lock.get():
        previous, _config = (
            _config,
            _Config(
                limiter,
                key_format,
                max_limit,
                error or AppInvokeQuotaExceededError,
                on_store_failure == "fail_open",
            ),
        )
        _holders.get().clear()
    if previous is not None:
        previous.limiter.close()
    return limiter


def _configured() -> _Config:
    if _config is None:
        raise RuntimeError("inflight_client.dify.configure(redis_client) has not been called")
    return _config


# Dify's flush of an app's limit key (KEYS[1]): 'read' takes the value found there and gives it another
# day, or, as 'write' does, writes ARGV[1] for a day (ARGV[3] s); answers the value in force.
_FLUSH = """
if ARGV[2] == 'read' then
  local found = redis.call('GET', KEYS[1])
  if found then
    redis.call('EXPIRE', KEYS[1], ARGV[3])
    return found
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
return ARGV[1]
"""


_log = logging.getLogger("inflight_client.dify")


class RateLimit:
    """Dify's per-app limit of active requests: ``enter`` takes a slot, ``exit`` gives it back, ``generate``
    wraps a streamed answer so that its end gives it back. One instance per ``client_id`` (as Dify's); the
    latest ``max_active_requests`` given applies. An id entered twice in this process counts once, and its
    slot stays until its last holder exits."""

    _UNLIMITED_REQUEST_ID = "unlimited_request_id"
    _instance_dict: dict[str, RateLimit] = {}
    _instance_lock: PerProcess[threading.Lock] = PerProcess(threading.Lock)

    client_id: str
    max_active_requests: int

    def __new__(cls, client_id: str, max_active_requests: int) -> RateLimit:
        with cls._instance_lock.get():
            if client_id not in cls._instance_dict:
                cls._instance_dict[client_id] = super().__new__(cls)
            return cls._instance_dict[client_id]

    def __init__(self, client_id: str, max_active_requests: int) -> None:
        changed = hasattr(self, "initialized") and self.max_active_requests != max_active_requests
        self.max_active_requests = max_active_requests
        self.client_id = client_id
        if changed:  # the app's limit changed in Dify: as Dify's class, write it where every worker reads it
            self.flush_cache(use_local_value=True)
        if self.disabled():
            return
        if hasattr(self, "initialized"):
            return
        self.initialized = True
        self.flush_cache(use_local_value=True)

    @property
    def key(self) -> str:
        """The inflight key of this app."""
        return _configured().key_format.format(self.client_id)

    def flush_cache(self, use_local_value: bool = False) -> None:
        """In inflight's layout, nothing: the admission reads the limit and the count in one atomic step.

        Under ``layout="dify"``, what Dify's own class does with the app's limit key
        (``dify:rate_limit:{app}:max_active_requests``, with ``REDIS_KEY_PREFIX``), so that a limit changed
        on a patched worker applies to every worker, patched or not, at its next admission:
        ``use_local_value=True`` writes this instance's ``max_active_requests`` there for a day (SETEX);
        otherwise the value there, if any, becomes this instance's (and its day starts again), else this
        instance's is written. (The constructor does the first when an app is first seen or its limit
        changes, as Dify's does.)"""
        config = _config
        if config is None or config.limiter.layout != "dify":
            return
        key = config.key_format.format(self.client_id)
        name = _dify_layout.limit_key(key, config.limiter.dify_key_prefix)
        # A script, not GET/SET: Dify's client would put its prefix before a name given to those a second
        # time, but leaves a script's keys as they are (as it does the admissions').
        mode = "write" if use_local_value else "read"
        ttl = _dify_layout.LIMIT_TTL
        value = config.limiter._redis.eval(_FLUSH, 1, name, self.max_active_requests, mode, ttl)
        self.max_active_requests = int(value)

    def enter(self, request_id: str | None = None) -> str:
        """Takes a slot for ``request_id`` (a new UUID when none); raises the configured error at the
        limit."""
        if self.disabled():
            return RateLimit._UNLIMITED_REQUEST_ID
        if not request_id:
            request_id = RateLimit.gen_request_key()
        config = _configured()
        key = config.key_format.format(self.client_id)
        with _lock.get():
            holding = _holders.get().get((key, request_id))
            if holding is not None and holding.permit.held:
                holding.count += 1
                return request_id
        limits = ClassLimits(self.max_active_requests, config.max_limit)
        try:
            permit = config.limiter._acquire((key,), request_id, 1, None, [limits])
        except TooManyRequests as refused:
            limit = refused.limit if refused.limit is not None else self.max_active_requests
            message = (
                "Too many requests. Please try again later. The current maximum concurrent requests allowed "
                f"for {self.client_id} is {limit}."
            )
            if config.error is AppInvokeQuotaExceededError:  # ours carries the figures too
                raise AppInvokeQuotaExceededError(message, limit, refused.in_flight, key) from None
            raise config.error(message) from None
        except StoreError as error:
            if not config.fail_open:
                raise
            _log.warning("Redis cannot be reached (%s): %s admitted without a limit", error, key)
            return RateLimit._UNLIMITED_REQUEST_ID
        duplicate = False
        try:
            holders = _holders.get()
            with _lock.get():
                holding = holders.get((key, request_id))
                if holding is not None and holding.permit.held:
                    # Entered meanwhile by another thread: the same id, one slot in Redis; keep one permit
                    # (releasing the other only counts it out of the limiter: the first still holds the id).
                    holding.count += 1
                    duplicate = True
                elif permit.held:
                    holders[(key, request_id)] = _Holding(permit, 1)
        except BaseException:
            # Redis admitted: no error leaves the slot taken (Dify answers the request with an error, and
            # nothing would ever exit this id).
            permit.release()
            raise
        if duplicate:
            permit.release()
        return request_id

    def exit(self, request_id: str) -> None:
        """Gives back ``request_id``'s slot when its last holder in this process exits (an id this process
        does not hold is released from Redis, as Dify's HDEL would)."""
        self._exit(request_id, now=True)

    def _exit(self, request_id: str, now: bool) -> None:
        if request_id == RateLimit._UNLIMITED_REQUEST_ID:
            return
        config = _configured()
        key = config.key_format.format(self.client_id)
        holders = _holders.get()
        with _lock.get():
            holding = holders.get((key, request_id))
            if holding is not None:
                holding.count -= 1
                if holding.count > 0:
                    return
                del holders[(key, request_id)]
        if holding is None:
            if now:
                config.limiter.release(key, request_id)
        elif now:
            holding.permit.release()
        else:
            held = holding.permit._take()
            if held is not None:
                config.limiter._renewer.queue_release(held)

    def disabled(self) -> bool:
        return self.max_active_requests <= 0

    @staticmethod
    def gen_request_key() -> str:
        return str(uuid.uuid4())

    def generate(self, generator: Any, request_id: str) -> Any:
        """A mapping (a blocking answer) as it is; a generator wrapped so that its end exits
        ``request_id``."""
        if isinstance(generator, Mapping):
            return generator
        return RateLimitGenerator(rate_limit=self, generator=generator, request_id=request_id)


class RateLimitGenerator(Iterator[T]):
    """Dify's wrapper: yields the generator's items and exits the request when it ends, raises or is
    closed (also before its first item), and when it is garbage-collected unclosed."""

    def __init__(
        self,
        rate_limit: RateLimit,
        generator: Generator[T, None, None] | Iterator[T] | Callable[[], Iterator[T]],
        request_id: str,
    ) -> None:
        self.rate_limit = rate_limit
        self.generator: Iterator[T] = generator() if callable(generator) else generator
        self.request_id = request_id
        self.closed = False

    def __iter__(self) -> RateLimitGenerator[T]:
        return self

    def __next__(self) -> T:
        if self.closed:
            raise StopIteration
        try:
            return next(self.generator)
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.rate_limit.exit(self.request_id)
            close = getattr(self.generator, "close", None)
            if self.generator is not None and callable(close):
                close()

    def __del__(self) -> None:
        # Never a Redis call from the garbage collector: the limiter's thread releases it.
        if not getattr(self, "closed", True):
            self.closed = True
            with contextlib.suppress(Exception):
                self.rate_limit._exit(self.request_id, now=False)


@contextlib.contextmanager
def rate_limit_context(rate_limit: RateLimit, request_id: str | None) -> Iterator[None]:
    """Dify's ``rate_limit_context``: holds ``request_id`` (entered once more) for the block, and exits it
    when the block ends, also when it raises (Dify's own exits only on success, so that an id it
    re-entered stayed held after an error)."""
    request_id = rate_limit.enter(request_id)
    try:
        yield
    finally:
        rate_limit.exit(request_id)
