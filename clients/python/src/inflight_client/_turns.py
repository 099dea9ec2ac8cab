"""Waiting with tickets: a waiter refused as full takes a ticket in the key's queue in Redis (``queue.lua``),
one queue for every process, Rust or Python, and is admitted in its turn (priority, then its flow's round,
then arrival). As the Rust library (``limiter/wait.rs``, ``store/wake.rs``, ``store/redis/wakeups.rs``):

- each limiter (in each process) has one turns channel, ``<prefix>turns:<uuid4 hex>``, subscribed at its
  first ticket and kept until the limiter is closed; a ticket is ``<channel>#<n>``, ``n`` counted per
  limiter;
- a release (or a waiter leaving the head) PUBLISHes ``"<n> <n2> ..."`` on the channel of the head's
  ticket: the tickets whose turn it is; ``<n>=<token>:<expires_at_ms>:<limit>:<in_flight>``, a ticket
  handed the slot (its waiter, on one key under an id of its wait's own, registered its admission: the
  release recorded the lease, and the waiter holds it without asking again); an admin revoking a waiter
  (``holders.lua``'s ``revoke_waiter``) PUBLISHes ``"<n>!"``: the ticket was given up for it, and its wait
  ends with :class:`Revoked`;
- a queued waiter asks again when its turn is called, or after at most :data:`RECHECK` (a turn lost with a
  broken subscription, a lease that expired), which also renews its ticket (:data:`TICKET_LEASE_MS`);
- a wait that ends unadmitted gives the ticket up (``batch.lua``'s ``l`` op); a process killed leaves its
  tickets to end with their lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._permit import Held, PerProcess
from ._policy import ClassLimits

log = logging.getLogger("inflight_client")

RECHECK = 1.0  # wait.rs's RECHECK, in seconds
TICKET_LEASE_MS = 3_000  # wait.rs's TICKET_LEASE_MS
RETRY = 0.1  # before subscribing again after the subscription broke (wakeups.rs)
_POLL = 0.2  # how often the listener looks whether its limiter was closed


def new_channel(prefix: str) -> str:
    return f"{prefix}turns:{uuid.uuid4().hex}"


def _text(data: object) -> str:
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)


# A slot handed to a ticket: its lease's token and expiry (ms, Redis clock), its key's limit and in flight.
Handed = tuple[int, int, int, int]


def _turns(message: str) -> Iterable[tuple[int, bool, Handed | None]]:
    """The tickets a message on a turns channel names (``wake.rs``'s ``wake_turns``): ``<n>``, its turn;
    ``<n>!``, revoked (True); ``<n>=token:expires_at_ms:limit:in_flight``, a slot handed to it."""
    for part in message.split(" "):
        revoked = part.endswith("!")
        n, _, handed = (part[:-1] if revoked else part).partition("=")
        if not (n.isascii() and n.isdigit()):
            continue
        if not handed:
            yield int(n), revoked, None
            continue
        figures = handed.split(":")
        if len(figures) == 4 and all(f.isascii() and f.isdigit() for f in figures):
            token, expires_at_ms, limit, in_flight = (int(f) for f in figures)
            yield int(n), revoked, (token, expires_at_ms, limit, in_flight)


def _wake(tickets: Mapping[int, Ticket | AsyncTicket], message: str | None) -> None:
    """Sets the turns of the tickets ``message`` names (``None``: every ticket), marking those revoked or
    handed the slot."""
    woken: list[Ticket | AsyncTicket] = []
    if message is None:
        woken.extend(tickets.values())
    else:
        for n, revoked, handed in _turns(message):
            ticket = tickets.get(n)
            if ticket is not None:
                if revoked:
                    ticket.revoked = True
                if handed is not None:
                    ticket.handed = handed
                woken.append(ticket)
    for ticket in woken:
        ticket.called.set()


def handed(
    keys: tuple[str, ...], id: str, weight: int, lease_ms: int, limits: Sequence[ClassLimits], handed: Handed
) -> tuple[Held, int, int]:
    """What the permit of a slot a release handed a waiter holds (its lease recorded under the wait's
    ``id``, for as long as its ticket would have lasted until first renewed); its key's limit, in flight."""
    token, expires_at_ms, limit, in_flight = handed
    held = Held(keys, id, weight, lease_ms, tuple(limits), expires_at_ms=expires_at_ms, token=token)
    held.first_lease_ms = TICKET_LEASE_MS
    return held, limit, in_flight


class Ticket:
    """One waiter's ticket (sync and gevent): its name, the event its turn sets, and whether an admin
    revoked it or a release handed it the slot (set before the event)."""

    __slots__ = ("name", "n", "called", "revoked", "handed")

    def __init__(self, name: str, n: int, called: threading.Event) -> None:
        self.name = name
        self.n = n
        self.called = called
        self.revoked = False
        self.handed: Handed | None = None


class _TurnsState:
    """A limiter's turns in one process (a fork's child has a channel of its own)."""

    def __init__(self, prefix: str) -> None:
        self.channel = new_channel(prefix)
        self.lock = threading.Lock()
        self.tickets: dict[int, Ticket] = {}
        self.next = 0
        self.heard = threading.Event()  # the channel's subscription is in force
        self.thread: threading.Thread | None = None


class Turns:
    """The turns of a sync limiter's tickets, heard by one daemon thread (a greenlet under gevent's
    monkey-patching) subscribed to the limiter's channel."""

    def __init__(self, redis_client: Any, prefix: str) -> None:
        self._redis = redis_client
        self._state = PerProcess(lambda: _TurnsState(prefix))
        self._closed = False

    def take(self) -> Ticket:
        """A new ticket; the channel is subscribed at the first."""
        state = self._state.get()
        with state.lock:
            n = state.next
            state.next += 1
            ticket = Ticket(f"{state.channel}#{n}", n, threading.Event())
            state.tickets[n] = ticket
            if state.thread is None and not self._closed:
                state.thread = threading.Thread(
                    target=self._listen, args=(state,), name="inflight-turns", daemon=True
                )
                state.thread.start()
        return ticket

    def drop(self, ticket: Ticket) -> None:
        state = self._state.get()
        with state.lock:
            state.tickets.pop(ticket.n, None)

    def heard(self, timeout: float) -> bool:
        """Waits (at most ``timeout``) until turns are heard: a turn called before then went unheard."""
        return self._state.get().heard.wait(max(timeout, 0.0))

    def is_heard(self) -> bool:
        """Whether turns are heard now: a ticket taken now has none called unheard."""
        return self._state.get().heard.is_set()

    def close(self) -> None:
        self._closed = True
        thread = self._state.get().thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2 * _POLL + 1.0)

    def _wake(self, state: _TurnsState, message: str | None) -> None:
        """Sets the turns of the tickets ``message`` names (``None``: every ticket)."""
        with state.lock:
            tickets = dict(state.tickets)
        _wake(tickets, message)

    def _listen(self, state: _TurnsState) -> None:
        while not self._closed:
            pubsub = self._redis.pubsub()
            try:
                pubsub.subscribe(state.channel)
                while not self._closed:
                    message = pubsub.get_message(timeout=_POLL)
                    if message is None:
                        continue
                    if message.get("type") in ("subscribe", b"subscribe"):
                        # Turns called while no subscription was in force went unheard: every ticket asks.
                        state.heard.set()
                        self._wake(state, None)
                    elif message.get("type") in ("message", b"message"):
                        self._wake(state, _text(message.get("data")))
            except Exception:
                state.heard.clear()
                log.debug("inflight: the subscription to turns broke; remaking it", exc_info=True)
                time.sleep(RETRY)
            finally:
                with contextlib.suppress(Exception):
                    pubsub.close()
        state.heard.clear()


class AsyncTicket:
    """One waiter's ticket (asyncio)."""

    __slots__ = ("name", "n", "called", "revoked", "handed")

    def __init__(self, name: str, n: int, called: asyncio.Event) -> None:
        self.name = name
        self.n = n
        self.called = called
        self.revoked = False
        self.handed: Handed | None = None


class AsyncTurns:
    """The turns of an asyncio limiter's tickets, heard by one task subscribed to its channel (on the loop
    of its first ticket)."""

    def __init__(self, redis_client: Any, prefix: str) -> None:
        self._redis = redis_client
        self.channel = new_channel(prefix)
        self._tickets: dict[int, AsyncTicket] = {}
        self._next = 0
        self._heard: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def take(self) -> AsyncTicket:
        n = self._next
        self._next += 1
        ticket = AsyncTicket(f"{self.channel}#{n}", n, asyncio.Event())
        self._tickets[n] = ticket
        if (self._task is None or self._task.done()) and not self._closed:
            self._heard = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._listen(self._heard))
        return ticket

    def drop(self, ticket: AsyncTicket) -> None:
        self._tickets.pop(ticket.n, None)

    def is_heard(self) -> bool:
        """Whether turns are heard now: a ticket taken now has none called unheard."""
        return self._heard is not None and self._heard.is_set()

    async def heard(self, timeout: float) -> None:
        """Waits (at most ``timeout``) until turns are heard."""
        if self._heard is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._heard.wait(), max(timeout, 0.0))

    async def close(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _listen(self, heard: asyncio.Event) -> None:
        while not self._closed:
            pubsub = self._redis.pubsub()
            try:
                await pubsub.subscribe(self.channel)
                while True:
                    message = await pubsub.get_message(timeout=None)
                    if message is None:
                        continue
                    if message.get("type") in ("subscribe", b"subscribe"):
                        heard.set()
                        _wake(self._tickets, None)
                    elif message.get("type") in ("message", b"message"):
                        _wake(self._tickets, _text(message.get("data")))
            except Exception:
                heard.clear()
                log.debug("inflight: the subscription to turns broke; remaking it", exc_info=True)
                await asyncio.sleep(RETRY)
            finally:
                closing = getattr(pubsub, "aclose", None) or pubsub.reset
                with contextlib.suppress(Exception):
                    await asyncio.shield(closing())
