"""Permits, their renewal by one background thread per limiter, and streams that hold a permit."""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

from ._policy import ClassLimits

log = logging.getLogger("inflight_client")

T = TypeVar("T")


def _epoch() -> tuple[int, object]:
    """What a lock or a thread belongs to: this process (a fork makes another), and the ``threading`` in use
    (gevent's monkey-patching replaces ``threading.Lock``)."""
    return os.getpid(), threading.Lock


class PerProcess(Generic[T]):
    """An object made on first use in each process and under each ``threading`` (see :func:`_epoch`): locks,
    conditions and threads made before a fork or before gevent's monkey-patching are never used after it.
    (Under gunicorn ``--preload``, a limiter is configured in the master, before the fork and before each
    gevent worker patches ``threading``: a lock made then fails in a worker's greenlets, and a thread made
    then does not exist in the worker.)"""

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._made: dict[tuple[int, object], T] = {}

    def get(self) -> T:
        epoch = _epoch()
        made = self._made.get(epoch)
        if made is None:
            # setdefault is atomic: two threads racing to make it both get the one kept.
            made = self._made.setdefault(epoch, self._factory())
        return made


@dataclass(eq=False)
class Held:
    """What a limiter must know to renew and release one permit. The renewer keeps these, never the
    permit itself, so that an unreleased permit can still be garbage-collected (and its finalizer run)."""

    keys: tuple[str, ...]
    id: str
    weight: int
    lease_ms: int
    limits: tuple[ClassLimits, ...]
    due: float = 0.0  # time.monotonic() of the next renewal
    done: bool = False  # released (or being released)
    lost: bool = False  # the store no longer holds it and could not re-add it
    expires_at_ms: int = 0
    token: int = 0  # the admission's fencing token
    extra: Any = field(default=None)  # backend data (the HTTP path)
    # The release, done once whatever interrupts it: whether this was the process's last holder of its keys
    # and id, and the token to release with (both set once, by ``Holders.count_out``); settled once the
    # store answered the release (or failed it: the lease then ends on its own).
    last: bool | None = None
    release_token: int | None = None
    settled: bool = False
    # What ``wait_lost`` waits on (a ``threading.Event``, an ``asyncio.Event`` for the asyncio limiter),
    # made by its first call: set once the permit is lost, released, or its limiter closed.
    watch: Any = None
    # A slot handed to a waiter is leased at first for as long as its ticket would have lasted (``hand_off``
    # in ``queue.lua``): its first renewal is due within a third of that.
    first_lease_ms: int = 0

    def schedule(self) -> None:
        lease_ms = min(self.lease_ms, self.first_lease_ms or self.lease_ms)
        self.first_lease_ms = 0
        self.due = time.monotonic() + max(lease_ms / 3000.0, 0.001)


class _HoldersState:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.members: dict[tuple[tuple[str, ...], str], set[Held]] = {}
        self.tokens: dict[tuple[tuple[str, ...], str], int] = {}


class Holders:
    """Which permits of this process hold each (keys, id): as in the Rust library, two permits under one
    id hold the slot until the last of them is released. A set of permits rather than a count, so that
    counting one out twice (a release interrupted, then finished by the renewer) counts it out once."""

    def __init__(self) -> None:
        # Per process: a child's permits are its own (its parent's are renewed and released by the parent).
        self._state = PerProcess(_HoldersState)

    @property
    def _lock(self) -> threading.RLock:
        return self._state.get().lock

    @property
    def _members(self) -> dict[tuple[tuple[str, ...], str], set[Held]]:
        return self._state.get().members

    @property
    def _tokens(self) -> dict[tuple[tuple[str, ...], str], int]:
        return self._state.get().tokens

    def holds(self, keys: tuple[str, ...], id: str) -> bool:
        """Whether a permit of this process holds ``keys`` under ``id``."""
        with self._lock:
            return bool(self._members.get((keys, id)))

    def add(self, held: Held) -> None:
        with self._lock:
            key = (held.keys, held.id)
            self._members.setdefault(key, set()).add(held)
            # The latest admission's (tokens grow): it took the lease over, so its token names it now.
            self._tokens[key] = max(self._tokens.get(key, 0), held.token)

    def token(self, held: Held) -> int:
        """The token of the latest admission of ``held``'s keys and id in this process."""
        with self._lock:
            return self._tokens.get((held.keys, held.id), held.token)

    def last(self, held: Held) -> bool:
        """Counts ``held`` out; True when it was the last holder (the store's lease must go)."""
        with self._lock:
            key = (held.keys, held.id)
            members = self._members.get(key)
            if members is None:
                return True
            members.discard(held)
            if members:
                return False
            del self._members[key]
            self._tokens.pop(key, None)
            return True

    def siblings(self, held: Held) -> list[Held]:
        """The other permits of this process holding ``held``'s keys under its id: they share its lease in
        the store, so they lose it with it."""
        with self._lock:
            return [h for h in self._members.get((held.keys, held.id), ()) if h is not held]

    def count_out(self, held: Held) -> tuple[bool, int]:
        """Counts ``held`` out once (asked again, the same answer): whether the store's lease must go, and
        the token to release it with. The token is read first: counting the last holder out forgets it."""
        with self._lock:
            if held.release_token is None:
                held.release_token = self.token(held)
            if held.last is None:
                held.last = self.last(held)
            return held.last, held.release_token


class _RenewerState:
    def __init__(self) -> None:
        self.cond = threading.Condition()  # an RLock: a finalizer may run while this thread holds it
        self.held: set[Held] = set()
        self.releases: deque[Held] = deque()
        self.calls: deque[Callable[[], None]] = deque()  # other calls to finish (a waiter's ticket given up)
        self.thread: threading.Thread | None = None


class Renewer:
    """One daemon thread per limiter: renews each held permit a third of the way through its lease and
    performs the releases that finalizers hand it (a finalizer never calls Redis itself: it may run in
    the middle of another Redis call of the same thread). Under gevent the thread is a greenlet."""

    def __init__(
        self,
        renew: Callable[[Held], bool],
        release: Callable[[Held], None],
        name: str = "inflight-renewer",
        siblings: Callable[[Held], Iterable[Held]] = lambda held: (),
    ) -> None:
        self._renew = renew
        self._release = release
        self._name = name
        self._siblings = siblings
        # The condition, the permits to renew and the thread: made in each process on first use, after the
        # fork and after gevent's patching (a fork's child renews none of its parent's permits).
        self._state = PerProcess(_RenewerState)
        self._closed = False

    @property
    def _cond(self) -> threading.Condition:
        return self._state.get().cond

    @property
    def _held(self) -> set[Held]:
        return self._state.get().held

    @property
    def _releases(self) -> deque[Held]:
        return self._state.get().releases

    @property
    def closed(self) -> bool:
        return self._closed

    def add(self, held: Held) -> None:
        state = self._state.get()
        with state.cond:
            if self._closed:
                raise RuntimeError("the limiter is closed")
            held.schedule()
            state.held.add(held)
            self._start(state)
            state.cond.notify()

    def _start(self, state: _RenewerState) -> None:
        """Starts the thread if it is not running (``state.cond`` held)."""
        if state.thread is None:
            state.thread = threading.Thread(target=self._run, args=(state,), name=self._name, daemon=True)
            state.thread.start()

    def call_later(self, call: Callable[[], None]) -> None:
        """Runs ``call`` from the thread (at once when the limiter is closed): a store call that must
        happen although its caller was interrupted (a waiter's ticket given up when a ``KeyboardInterrupt``,
        a gevent ``Timeout`` or ``GreenletExit`` ends its wait). ``close()`` waits for it."""
        state = self._state.get()
        with state.cond:
            if not self._closed:
                state.calls.append(call)
                self._start(state)
                state.cond.notify()
                return
        self._safe_call(call)

    @staticmethod
    def _safe_call(call: Callable[[], None]) -> None:
        try:
            call()
        except Exception:
            log.warning("inflight: a call handed to the renewer failed", exc_info=True)

    def take(self, held: Held) -> bool:
        """Marks ``held`` released; False when it already was."""
        with self._cond:
            if held.done:
                return False
            held.done = True
            self._held.discard(held)
            _settle(held)
            return True

    def wait_lost(self, held: Held, timeout: float | None) -> bool:
        """Waits until ``held`` is lost (True), or released, or the limiter closed, or ``timeout`` passed
        (False)."""
        with self._cond:
            if held.watch is None:
                held.watch = threading.Event()
                if held.lost or held.done or self._closed:
                    held.watch.set()
            watch = held.watch
        watch.wait(timeout)
        return held.lost

    def release_later(self, held: Held) -> None:
        """For finalizers: releases ``held`` from the thread (at once when the limiter is closed)."""
        if self.take(held):
            self.queue_release(held)

    def queue_release(self, held: Held) -> None:
        """Releases ``held``, already taken, from the thread (at once when the limiter is closed)."""
        state = self._state.get()
        with state.cond:
            if not self._closed and state.thread is not None:
                state.releases.append(held)
                state.cond.notify()
                return
        self._safe_release(held)

    def _safe_release(self, held: Held, again: bool = False) -> None:
        """Releases ``held`` once (``again``: also when it was, since a renewal on its way when it was
        released may have put its lease back; the release is counted out once and names the same token)."""
        if held.settled and not again:
            return
        try:
            self._release(held)
        except Exception:  # the lease ends on its own
            log.warning("inflight: releasing permit %s failed", held.id, exc_info=True)
        held.settled = True

    def finish_interrupted(self, held: Held) -> None:
        """A release of ``held`` was interrupted (KeyboardInterrupt, gevent's ``Timeout`` or ``GreenletExit``
        killing the caller): the thread finishes it, whichever step the interruption stopped at."""
        with self._cond:
            held.done = True
            self._held.discard(held)
            _settle(held)
        if not held.settled:
            self.queue_release(held)

    def close(self) -> None:
        state = self._state.get()
        with state.cond:
            self._closed = True
            state.cond.notify_all()
            thread = state.thread
            for held in state.held:  # renewed no more: nobody will hear them lost
                _settle(held)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        with state.cond:
            pending = list(state.releases)
            state.releases.clear()
            calls = list(state.calls)
            state.calls.clear()
        for held in pending:
            self._safe_release(held)
        for call in calls:
            self._safe_call(call)

    def _run(self, state: _RenewerState) -> None:
        cond, held_set, queue, calls = state.cond, state.held, state.releases, state.calls
        while True:
            with cond:
                while not self._closed:
                    if queue or calls:
                        break
                    now = time.monotonic()
                    if any(h.due <= now for h in held_set):
                        break
                    timeout = min((h.due for h in held_set), default=now + 60.0) - now
                    cond.wait(timeout)
                if self._closed:
                    return
                releases = list(queue)
                queue.clear()
                pending = list(calls)
                calls.clear()
                now = time.monotonic()
                due = [h for h in held_set if h.due <= now]
            for held in releases:
                self._safe_release(held)
            for call in pending:
                self._safe_call(call)
            for held in due:
                self._renew_one(held, state)

    def _renew_one(self, held: Held, state: _RenewerState) -> None:
        if held.done or held.lost:
            return
        try:
            kept = self._renew(held)
        except Exception:
            log.warning("inflight: renewing permit %s failed; retrying", held.id, exc_info=True)
            held.due = time.monotonic() + min(1.0, held.lease_ms / 3000.0)
            return
        siblings = () if kept else list(self._siblings(held))
        with state.cond:
            released_meanwhile = held.done
            if kept and not released_meanwhile:
                held.schedule()
            elif not kept:
                log.warning("inflight: permit %s was lost (revoked, or its lease gone in the store)", held.id)
                mark_lost(held, siblings, state.held)
        if kept and released_meanwhile:
            self._safe_release(held, again=True)


def _settle(held: Held) -> None:
    """Wakes those waiting to hear whether ``held`` is lost (the caller holds its limiter's lock)."""
    if held.watch is not None:
        held.watch.set()


def mark_lost(held: Held, siblings: Iterable[Held], renewed: set[Held]) -> None:
    """``held`` is lost (its lease revoked, or gone at renewal without room to come back): renewed no more,
    and those waiting to hear it told (the caller holds its limiter's lock). ``siblings``, the permits of
    this process holding the same lease, are lost with it (those not released): renewing them would add
    back a revoked lease."""
    for lost in (held, *(h for h in siblings if not h.done)):
        lost.lost = True
        renewed.discard(lost)
        _settle(lost)


class _Keeper(Protocol):
    def take(self, held: Held) -> bool: ...
    def release_later(self, held: Held) -> None: ...


class PermitBase:
    """What :class:`Permit` and ``AsyncPermit`` share."""

    def __init__(
        self,
        keys: tuple[str, ...],
        id: str,
        weight: int,
        limit: int | None,
        in_flight: int,
        expires_at_ms: int | None,
        held: Held | None,
        keeper: _Keeper | None,
        token: int = 0,
    ) -> None:
        self.keys = keys
        self.id = id
        self.weight = weight
        self.limit = limit
        self.in_flight = in_flight
        self._expires_at_ms = expires_at_ms
        self._token = token
        self._held = held
        self._keeper = keeper
        # The key whose queue it waited in before it was admitted (the one that refused it last) and that
        # key's class: set by a waiting acquire that queued (the Rust library's ``Permit::queued_on``).
        self.queued_on: str | None = None
        self.queued_class: str | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        if held is not None and keeper is not None:
            # The backstop: a permit collected unreleased is released (by the limiter's thread or task).
            self._finalizer = weakref.finalize(self, keeper.release_later, held)

    @property
    def key(self) -> str:
        return self.keys[0]

    @property
    def expires_at_ms(self) -> int | None:
        """When the lease ends unless renewed (ms since the epoch, Redis clock); ``None``: nothing held."""
        if self._held is not None and self._held.expires_at_ms:
            return self._held.expires_at_ms
        return self._expires_at_ms

    @property
    def token(self) -> int:
        """The admission's fencing token: larger than every token given before on each of its keys, by
        every process (Rust or Python) sharing the store; 0 when nothing is held or under the Dify layout."""
        return self._held.token if self._held is not None else self._token

    @property
    def held(self) -> bool:
        """True while the permit holds its slot (not released, not lost)."""
        return self._held is not None and not self._held.done and not self._held.lost

    @property
    def lost(self) -> bool:
        """True once a renewal found the lease gone: an admin revoked it (``inflight serve``'s ``DELETE
        /v1/keys/{key}/permits/{id}?revoke=true``, the Rust library's ``Limiter::revoke``), or it ended in
        the store and the key had no room to take it back. Heard at the permit's next renewal (a third of
        its lease). The request is no longer counted; finishing its work is safe, and releasing it is
        harmless (the rule of the Rust library's ``Permit::is_lost``)."""
        return self._held is not None and self._held.lost

    def _take(self) -> Held | None:
        if self._held is None or self._keeper is None:
            return None
        if self._finalizer is not None:
            self._finalizer.detach()
        return self._held if self._keeper.take(self._held) else None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(keys={self.keys!r}, id={self.id!r}, limit={self.limit}, "
            f"in_flight={self.in_flight})"
        )


class Permit(PermitBase):
    """A slot on one key (or on each of several keys), held until released.

    Use it as a context manager, or call :meth:`release` (also :meth:`close`); both are idempotent. A permit
    garbage-collected unreleased is released by a finalizer. ``limit`` is ``None`` for an unlimited key
    (nothing is held then); ``key``, ``limit`` and ``in_flight`` are those of the first key.

    ``queued_on`` is the key whose queue a waiting acquire (``acquire``, ``acquire_all``) stood in before
    it was admitted (the key that refused it last), ``None`` when it was admitted without waiting (as the
    Rust library's ``Permit::queued_on``); ``queued_class`` is that key's class (its rule's pattern, or
    ``"default"``; ``None`` when not known).
    """

    def __init__(
        self,
        keys: tuple[str, ...],
        id: str,
        weight: int,
        limit: int | None,
        in_flight: int,
        expires_at_ms: int | None,
        held: Held | None,
        renewer: Renewer | None,
        token: int = 0,
    ) -> None:
        super().__init__(keys, id, weight, limit, in_flight, expires_at_ms, held, renewer, token)
        self._renewer = renewer

    def release(self) -> bool:
        """Releases the slot now; False when there was nothing (left) to release. Never raises: a release
        that fails leaves a lease that ends on its own. Interrupted (KeyboardInterrupt, a gevent
        ``Timeout``, the greenlet killed), it re-raises once the limiter's thread has the release to
        finish: the slot is freed all the same."""
        held, renewer = self._held, self._renewer
        if held is None or renewer is None:
            return False
        try:
            if self._take() is None:
                return False
            renewer._safe_release(held)
            return True
        except BaseException:
            renewer.finish_interrupted(held)
            raise

    def close(self) -> None:
        """The same as :meth:`release`."""
        self.release()

    def wait_lost(self, timeout: float | None = None) -> bool:
        """Blocks until the permit is lost (:attr:`lost`: revoked by an admin, or gone at renewal): True.
        False once ``timeout`` seconds have passed (``None``: no bound), or at once when it can no longer
        be lost: released, its limiter closed, or holding nothing (an unlimited key's). Heard at the
        permit's next renewal, a third of its lease after the last; a watchdog thread can wait here and
        stop the permit's work (a stream) when its slot was taken away."""
        held, renewer = self._held, self._renewer
        if held is None or renewer is None:
            return False
        return renewer.wait_lost(held, timeout)

    def __enter__(self) -> Permit:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class GuardedStream(Generic[T]):
    """Yields every item of ``iterable`` and releases ``permit`` when the stream ends, raises, or is closed
    (also when closed before its first item: a class, not a generator, so ``close()`` always runs)."""

    def __init__(self, permit: Permit, iterable: Iterable[T]) -> None:
        self._permit = permit
        self._source = iterable
        self._iterator: Iterator[T] | None = None
        self._done = False

    def __iter__(self) -> GuardedStream[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        try:
            if self._iterator is None:
                self._iterator = iter(self._source)
            return next(self._iterator)
        except BaseException:  # StopIteration, an error, GeneratorExit thrown in
            self._finish()
            raise

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            self._permit.release()

    def close(self) -> None:
        """Releases the permit and closes the source."""
        try:
            self._finish()
        finally:
            close = getattr(self._iterator if self._iterator is not None else self._source, "close", None)
            if callable(close):
                close()

    def __enter__(self) -> GuardedStream[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
