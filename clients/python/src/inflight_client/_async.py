"""``AsyncRedisLimiter``: the asyncio twin of ``RedisLimiter``, on ``redis.asyncio``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Sequence
from types import TracebackType
from typing import Any, Generic, TypeVar

import redis
import redis.asyncio

from . import _core, _input
from ._errors import Revoked, StoreError, TooManyRequests
from ._permit import Held, Holders, PermitBase, mark_lost
from ._policy import ClassLimits, Policy, RuleLike
from ._turns import RECHECK, TICKET_LEASE_MS, AsyncTurns, handed

log = logging.getLogger("inflight_client")

T = TypeVar("T")


class AsyncRenewer:
    """One task per limiter (on the loop of its first permit): renews each permit at a third of its lease.
    Every release runs as a task of its own, kept here until it ends (``close()`` waits for them): a
    caller cancelled while it awaits one (an ASGI server cancels the handler of a client that left)
    leaves the release running, never abandoned halfway."""

    def __init__(
        self,
        renew: Callable[[Held], Awaitable[bool]],
        release: Callable[[Held], Awaitable[None]],
        siblings: Callable[[Held], Iterable[Held]] = lambda held: (),
    ) -> None:
        self._renew = renew
        self._release = release
        self._siblings = siblings
        self._lock = threading.RLock()
        self._held: set[Held] = set()
        self._releases: deque[Held] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._releasing: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def add(self, held: Held) -> None:
        if self._closed:
            raise RuntimeError("the limiter is closed")
        held.schedule()
        with self._lock:
            self._held.add(held)
        if self._task is None or self._task.done():
            self._loop = asyncio.get_running_loop()
            self._wake = asyncio.Event()
            self._task = self._loop.create_task(self._run())
        assert self._wake is not None
        self._wake.set()

    def take(self, held: Held) -> bool:
        with self._lock:
            if held.done:
                return False
            held.done = True
            self._held.discard(held)
        self._settle(held)
        return True

    def _settle(self, held: Held) -> None:
        """Wakes those waiting to hear whether ``held`` is lost (from any thread: a finalizer's release)."""
        watch: asyncio.Event | None = held.watch
        if watch is None or watch.is_set():
            return
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        loop = self._loop
        if loop is None or running is loop:
            watch.set()
        elif not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(watch.set)

    async def wait_lost(self, held: Held, timeout: float | None) -> bool:
        """Waits until ``held`` is lost (True), or released, or the limiter closed, or ``timeout`` passed
        (False)."""
        with self._lock:
            if held.watch is None:
                held.watch = asyncio.Event()
                if held.lost or held.done or self._closed:
                    held.watch.set()
            watch: asyncio.Event = held.watch
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(watch.wait(), timeout)
        return held.lost

    def release_later(self, held: Held) -> None:
        if not self.take(held):
            return
        loop = self._loop
        if self._closed or loop is None or loop.is_closed():
            return  # no loop to call Redis on: the lease ends on its own
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._queue, held)

    def _queue(self, held: Held) -> None:
        self._releases.append(held)
        if self._wake is not None:
            self._wake.set()

    async def safe_release(self, held: Held, again: bool = False) -> None:
        """Releases ``held`` once (``again``: also when it was, since a renewal on its way when it was
        released may have put its lease back; the release is counted out once and names the same token)."""
        if held.settled and not again:
            return
        try:
            await self._release(held)
        except Exception:
            log.warning("inflight: releasing permit %s failed", held.id, exc_info=True)
        held.settled = True

    def _spawn_release(self, held: Held, again: bool = False) -> asyncio.Task[None]:
        """The release as a task of its own, referenced until it ends (the loop keeps only weak ones)."""
        task = asyncio.get_running_loop().create_task(self.safe_release(held, again))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)
        return task

    def spawn(self, call: Coroutine[Any, Any, object]) -> asyncio.Task[None] | None:
        """Runs ``call`` as a task of its own, kept until it ends (``close()`` waits for it): a store call
        that must happen although its caller was cancelled (a waiter's ticket given up, an admission
        given back). ``None`` without a running loop (the store's leases end on their own)."""

        async def safe() -> None:
            try:
                await call
            except Exception:
                log.warning("inflight: a call of the limiter's failed", exc_info=True)

        try:
            task = asyncio.get_running_loop().create_task(safe())
        except RuntimeError:
            call.close()
            return None
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)
        return task

    async def release_now(self, held: Held) -> None:
        """Releases ``held`` (already taken) and waits for it; cancelled meanwhile, the caller gets its
        ``CancelledError`` at once and the release goes on (``close()`` waits for it)."""
        await asyncio.shield(self._spawn_release(held))

    async def close(self) -> None:
        self._closed = True
        with self._lock:
            renewed = list(self._held)
        for held in renewed:  # renewed no more: nobody will hear them lost
            self._settle(held)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        while self._releases:
            self._spawn_release(self._releases.popleft())
        while self._releasing:
            # asyncio.wait, not gather: cancelled, close() leaves the releases running.
            await asyncio.wait(set(self._releasing))

    async def _run(self) -> None:
        assert self._wake is not None
        while not self._closed:
            now = time.monotonic()
            with self._lock:
                due = [h for h in self._held if h.due <= now]
                next_due = min((h.due for h in self._held), default=now + 60.0)
            if not due and not self._releases:
                self._wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), max(next_due - now, 0.001))
                continue
            while self._releases:
                self._spawn_release(self._releases.popleft())
            for held in due:
                if held.done or held.lost:
                    continue
                try:
                    kept = await self._renew(held)
                except Exception:
                    log.warning("inflight: renewing permit %s failed; retrying", held.id, exc_info=True)
                    held.due = time.monotonic() + min(1.0, held.lease_ms / 3000.0)
                    continue
                siblings = () if kept else list(self._siblings(held))
                with self._lock:
                    released_meanwhile = held.done
                    if kept and not released_meanwhile:
                        held.schedule()
                    elif not kept:
                        mark_lost(held, siblings, self._held)
                if kept and released_meanwhile:
                    self._spawn_release(held, again=True)


class AsyncPermit(PermitBase):
    """A permit of :class:`AsyncRedisLimiter`: ``async with``, or ``await permit.release()``. Its
    attributes are :class:`Permit`'s (``queued_on``, ``queued_class`` included)."""

    def __init__(
        self,
        keys: tuple[str, ...],
        id: str,
        weight: int,
        limit: int | None,
        in_flight: int,
        expires_at_ms: int | None,
        held: Held | None,
        renewer: AsyncRenewer | None,
    ) -> None:
        super().__init__(keys, id, weight, limit, in_flight, expires_at_ms, held, renewer)
        self._renewer = renewer

    async def release(self) -> bool:
        """Releases the slot now; False when there was nothing (left) to release. Never raises, but a
        caller cancelled while it waits gets its ``CancelledError``: the release itself goes on in a task
        of the limiter (``close()`` waits for those), so the slot is freed all the same."""
        held = self._take()
        if held is None or self._renewer is None:
            return False
        await self._renewer.release_now(held)
        return True

    async def close(self) -> None:
        await self.release()

    async def wait_lost(self, timeout: float | None = None) -> bool:
        """Completes once the permit is lost (:attr:`lost`: revoked by an admin, or gone at renewal): True.
        False once ``timeout`` seconds have passed (``None``: no bound), or at once when it can no longer
        be lost: released, its limiter closed, or holding nothing (an unlimited key's). Heard at the
        permit's next renewal, a third of its lease after the last; race it against the permit's work
        (``asyncio.wait``, a ``TaskGroup``) to stop that work when its slot was taken away. Cancelling it
        changes nothing of the permit."""
        held, renewer = self._held, self._renewer
        if held is None or renewer is None:
            return False
        return await renewer.wait_lost(held, timeout)

    async def __aenter__(self) -> AsyncPermit:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.release()


class AsyncGuardedStream(Generic[T]):
    """Yields every item of an (async) iterable; releases the permit when it ends, raises or is closed
    (``aclose()``), also before its first item."""

    def __init__(self, permit: AsyncPermit, iterable: AsyncIterable[T] | Iterable[T]) -> None:
        self._permit = permit
        self._source = iterable
        self._iterator: AsyncIterator[T] | None = None
        self._sync: Any = None
        self._done = False

    def __aiter__(self) -> AsyncGuardedStream[T]:
        return self

    async def __anext__(self) -> T:
        if self._done:
            raise StopAsyncIteration
        try:
            if isinstance(self._source, AsyncIterable):
                if self._iterator is None:
                    self._iterator = aiter(self._source)
                return await anext(self._iterator)
            if self._sync is None:
                self._sync = iter(self._source)
            try:
                item: T = next(self._sync)
            except StopIteration:
                raise StopAsyncIteration from None
            return item
        except BaseException:
            await self._finish()
            raise

    async def _finish(self) -> None:
        if not self._done:
            self._done = True
            await self._permit.release()

    async def aclose(self) -> None:
        try:
            await self._finish()
        finally:
            source = self._iterator if self._iterator is not None else self._sync or self._source
            aclose = getattr(source, "aclose", None)
            close = getattr(source, "close", None)
            if callable(aclose):
                await aclose()
            elif callable(close):
                close()

    async def __aenter__(self) -> AsyncGuardedStream[T]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncRedisLimiter:
    """The asyncio twin of :class:`RedisLimiter`: the same arguments and methods, as coroutines."""

    def __init__(
        self,
        redis_client: redis.asyncio.Redis,
        default_limit: int = 0,
        max_limit: int = 0,
        limits: Iterable[RuleLike] = (),
        lease: float = 30.0,
        prefix: str = "inflight:",
    ) -> None:
        self.policy = Policy(default_limit, max_limit, limits)
        self.prefix = prefix
        self.lease_ms = _core.to_lease_ms(lease)
        self._redis = redis_client
        self._batch = redis_client.register_script(_core.script_text("batch"))
        self._lone = redis_client.register_script(_core.script_text("lone"))
        self._passed = _core.Passed()
        self._renew = redis_client.register_script(_core.script_text("renew"))
        self._status = redis_client.register_script(_core.script_text("status"))
        self._holders = Holders()
        self._renewer = AsyncRenewer(self._renew_held, self._release_held, self._holders.siblings)
        self._turns = AsyncTurns(redis_client, prefix)

    async def _records(self, keys: list[str], args: list[_core.Arg]) -> Any:
        """``batch.lua``'s answer to one record; ``lone.lua``'s where it takes it (``_core.lone``)."""
        if _core.lone(args) and self._passed.may_take(keys[0]):
            reply = await self._call(self._lone, keys, args)
            if reply != []:
                return reply
            self._passed.note(keys[0])
        return await self._call(self._batch, keys, args)

    async def _call(self, script: Any, keys: list[str], args: list[_core.Arg]) -> Any:
        try:
            return await script(keys=keys, args=args)
        except redis.RedisError as error:
            raise StoreError(str(error)) from error

    async def try_acquire(
        self,
        key: str,
        id: str | None = None,
        weight: int = 1,
        lease: float | None = None,
        *,
        holder: str | None = None,
    ) -> AsyncPermit:
        """As :meth:`RedisLimiter.try_acquire`."""
        return await self.try_acquire_all([key], id=id, weight=weight, lease=lease, holder=holder)

    async def try_acquire_all(
        self,
        keys: Sequence[str],
        id: str | None = None,
        weight: int = 1,
        lease: float | None = None,
        *,
        holder: str | None = None,
    ) -> AsyncPermit:
        """As :meth:`RedisLimiter.try_acquire_all`."""
        unique = _core.unique_keys(keys)
        limits = [self.policy.limits(k) for k in unique]
        return await self._acquire(unique, id, weight, lease, limits, holder=_input.holder(holder))

    async def acquire(
        self,
        key: str,
        max_wait: float,
        id: str | None = None,
        weight: int = 1,
        lease: float | None = None,
        priority: int = 0,
        flow: str = "",
        *,
        holder: str | None = None,
    ) -> AsyncPermit:
        """As :meth:`RedisLimiter.acquire`: a cancelled wait leaves the key's queue (in a task of the
        limiter, which ``close()`` waits for)."""
        return await self.acquire_all([key], max_wait, id, weight, lease, priority, flow, holder=holder)

    async def acquire_all(
        self,
        keys: Sequence[str],
        max_wait: float,
        id: str | None = None,
        weight: int = 1,
        lease: float | None = None,
        priority: int = 0,
        flow: str = "",
        *,
        holder: str | None = None,
    ) -> AsyncPermit:
        """As :meth:`RedisLimiter.acquire_all`."""
        unique = _core.unique_keys(keys)
        wait_ms = _input.max_wait_ms(max_wait)
        priority, flow = _input.priority(priority), _input.flow(flow)
        holder = _input.holder(holder)
        limits = [self.policy.limits(k) for k in unique]
        if wait_ms == 0:
            return await self._acquire(unique, id, weight, lease, limits, holder=holder)
        if id is not None:
            _input.id(id)
        _core.check_weight(weight)
        if lease is not None:
            _core.to_lease_ms(lease)
        if self._renewer.closed:
            raise RuntimeError("the limiter is closed")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        ticket = self._turns.take()
        wait_id, wait = _core.waiting(unique, id, ticket.name, priority, flow, TICKET_LEASE_MS)
        admitted = interrupted = False
        queued_on: _core.Queued | None = None  # its last refusal: the key whose queue it waits in
        try:
            heard, fresh = self._turns.is_heard(), wait.handoff
            while True:
                ticket.called.clear()  # a turn called from now on is kept until the wait below
                ticket.handed = None  # (a slot handed before this ask is the ask's: its id holds it)
                try:
                    permit = await self._acquire(unique, wait_id, weight, lease, limits, wait, holder, fresh)
                except _core.Queued as queued:
                    refused = queued_on = queued
                else:
                    admitted = permit.expires_at_ms is not None
                    if queued_on is not None:
                        permit.queued_on, permit.queued_class = queued_on.key, queued_on.key_class
                    return permit
                fresh = False
                if ticket.revoked:  # (its ask, after the revocation, took no place)
                    raise Revoked(refused.key)
                if ticket.handed is not None:  # handed while the ask was on its way: asked again at once
                    continue
                left = deadline - loop.time()
                if left <= 0:
                    raise TooManyRequests(
                        refused.limit, refused.in_flight, refused.key, key_class=refused.key_class
                    ) from None
                if not heard:
                    heard = True
                    await self._turns.heard(min(RECHECK, left))
                    continue
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(ticket.called.wait(), min(RECHECK, left))
                if ticket.revoked:
                    raise Revoked(refused.key)
                if ticket.handed is not None and wait_id is not None:  # held, without asking again
                    lease_ms = self.lease_ms if lease is None else _core.to_lease_ms(lease)
                    permit = self._hold(*handed(unique, wait_id, weight, lease_ms, limits, ticket.handed))
                    admitted = True
                    permit.queued_on, permit.queued_class = refused.key, refused.key_class
                    return permit
        except BaseException as error:
            interrupted = not isinstance(error, Exception)  # CancelledError, GeneratorExit
            raise
        finally:
            self._turns.drop(ticket)
            if not admitted and not ticket.revoked:  # (a revoked ticket was given up by the revocation)
                # A task of the limiter's: a cancelled waiter's ticket leaves all the same (with the wait's
                # id: a slot a release handed it goes back).
                given = wait_id if wait.handoff else None
                leaving = self._renewer.spawn(self._leave(unique, ticket.name, given))
                if leaving is not None and not interrupted:
                    await asyncio.shield(leaving)

    async def _leave(self, keys: tuple[str, ...], ticket: str, id: str | None = None) -> None:
        names, args = _core.key_names(self.prefix, keys), _core.leave_args(keys, ticket, id)
        reply = await self._call(self._batch, names, args)
        _core.ints(reply, 1)

    async def _acquire(
        self,
        keys: tuple[str, ...],
        id: str | None,
        weight: int,
        lease: float | None,
        limits: Sequence[ClassLimits],
        wait: _core.Wait | None = None,
        holder: str | None = None,
        fresh: bool = False,
    ) -> AsyncPermit:
        if self._renewer.closed:
            raise RuntimeError("the limiter is closed")
        keys = _core.unique_keys(keys)
        generated = id is None or fresh  # (a wait's first ask under its own id: no lease can hold it)
        id = _core.check_id(id)
        weight = _core.check_weight(weight)
        lease_ms = self.lease_ms if lease is None else _core.to_lease_ms(lease)
        held_before = self._holders.holds(keys, id)
        try:
            reply = await self._records(
                _core.key_names(self.prefix, keys),
                _core.acquire_args(keys, id, weight, lease_ms, limits, generated, wait, holder),
            )
        except BaseException as error:
            # Cancelled (or timed out) waiting for the answer: Redis may have admitted. Give the slot back
            # (in a task of the limiter's) unless another permit here holds the id, as RedisLimiter does.
            unanswered = not isinstance(error, Exception) or isinstance(error.__cause__, redis.TimeoutError)
            if unanswered and not held_before:
                self._renewer.spawn(self.release(keys, id, 0))
            raise
        limit, in_flight, expires_at_ms, token = _core.admission(reply, keys, weight, self.policy)
        if expires_at_ms is None:
            return AsyncPermit(keys, id, weight, None, 0, None, None, None)
        held = Held(keys, id, weight, lease_ms, tuple(limits), expires_at_ms=expires_at_ms, token=token)
        return self._hold(held, limit, in_flight)

    def _hold(self, held: Held, limit: int | None, in_flight: int) -> AsyncPermit:
        """The permit of ``held``, which Redis recorded: renewed from now on."""
        self._holders.add(held)
        self._renewer.add(held)
        args = (held.keys, held.id, held.weight, limit, in_flight, held.expires_at_ms)
        return AsyncPermit(*args, held, self._renewer)

    async def release(self, keys: str | Sequence[str], id: str, token: int = 0) -> bool:
        """As :meth:`RedisLimiter.release`."""
        unique = _core.unique_keys([keys] if isinstance(keys, str) else keys)
        args = _core.release_args(unique, _input.id(id), token)
        reply = await self._records(_core.key_names(self.prefix, unique), args)
        return _core.ints(reply, 1)[0] == 1

    async def _release_held(self, held: Held) -> None:
        last, token = self._holders.count_out(held)
        if last:
            await self.release(held.keys, held.id, token)

    async def _renew_held(self, held: Held) -> bool:
        reply = await self._call(
            self._renew,
            _core.key_names(self.prefix, held.keys),
            _core.renew_args(held.id, held.lease_ms, held.weight, held.limits, self._holders.token(held)),
        )
        outcome, _limit, _in_flight, _weight, expires_at_ms, _held, _token = _core.ints(reply, 7)
        if outcome in (1, 2):
            held.expires_at_ms = expires_at_ms
            return True
        return False

    async def status(self, key: str) -> _core.KeyStatus:
        return await self._status_with(key, "")

    async def set_limit(self, key: str, limit: int) -> _core.KeyStatus:
        return await self._status_with(key, _core.change_arg(limit))

    async def clear_limit(self, key: str) -> _core.KeyStatus:
        return await self._status_with(key, "0")

    async def _status_with(self, key: str, change: str) -> _core.KeyStatus:
        key = _input.key(key)
        keys, args = _core.status_call(self.prefix, key, self.policy.limits(key), change)
        return _core.status(await self._call(self._status, keys, args), key, 4)

    def guard_stream(
        self, permit: AsyncPermit, iterable: AsyncIterable[T] | Iterable[T]
    ) -> AsyncGuardedStream[T]:
        return AsyncGuardedStream(permit, iterable)

    async def close(self) -> None:
        await self._turns.close()
        await self._renewer.close()

    async def __aenter__(self) -> AsyncRedisLimiter:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
