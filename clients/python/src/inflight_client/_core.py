"""The scripts' arguments and answers, shared by the sync and asyncio limiters (``batch.rs``, ``mod.rs``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import NamedTuple

from . import _input, _keys
from ._errors import TooManyRequests, TooManyWaiters, UnexpectedAnswer, WeightExceedsLimit
from ._input import MAX_KEYS, MAX_LEASE_MS, MIN_LEASE_MS
from ._input import MAX_LIMIT as MAX_OVERRIDE
from ._policy import ClassLimits, Policy

__all__ = ["MAX_KEYS", "MAX_LEASE_MS", "MIN_LEASE_MS", "MAX_OVERRIDE"]

Arg = str | bytes | int


def script_text(name: str) -> str:
    """The entry point ``name`` as inflight runs it: the files ``scripts/manifest`` names for it, in order
    (as ``scripts.rs`` reads the same manifest)."""
    folder = resources.files("inflight_client") / "scripts"
    for line in (folder / "manifest").read_text("utf-8").splitlines():
        entry, _, files = line.partition(" = ")
        if entry == name:
            return "".join((folder / part).read_text("utf-8") for part in files.split(" "))
    raise LookupError(f"scripts/manifest names no entry point {name}")


class Answer(NamedTuple):
    """A script's answer to one admission, in ``base.lua``'s ``answer``'s order (``answer.rs``'s
    ``Answer``): ``batch.lua``'s and ``dify.lua``'s alike."""

    decision: int
    index: int
    limit: int
    in_flight: int
    expires_at_ms: int
    reclaimed: int
    token: int
    held_weight: int
    held_lease_ms: int
    held_token: int
    counted: int  # (bits 16 to 31: the keys past a shadow limit, which this client never asks for)
    tickets_expired: int


# ``Answer.decision`` (``base.lua``'s names).
FULL, ADMITTED, UNLIMITED, TOO_HEAVY, WAITS, WAITERS_BOUND = range(6)


@dataclass(frozen=True)
class KeyStatus:
    """A key's effective limit (``None``: unlimited), its override (``None``: none) and in-flight count."""

    key: str
    limit: int | None
    override: int | None
    in_flight: int


def to_lease_ms(lease: object) -> int:
    """A lease in seconds as whole ms (``_input.lease_ms``: 100 ms to 24 h, finite)."""
    return _input.lease_ms(lease)


def to_age_ms(age: object) -> int:
    """An age (``dify_stale_after``) in ms: 1 ms to 24 h."""
    return _input.age_ms(age)


def check_weight(weight: object) -> int:
    return _input.weight(weight)


def check_id(id: object) -> str:
    """A given id, checked; ``None``: a generated one."""
    if id is None:
        return _keys.new_id()
    return _input.id(id)


def unique_keys(keys: object) -> tuple[str, ...]:
    """The keys once each, in order; 1 to 16 of them, each checked."""
    return _input.keys(keys)


def key_names(prefix: str, keys: Sequence[str]) -> list[str]:
    out: list[str] = []
    for key in keys:
        out.extend(_keys.names(prefix, key))
    return out


@dataclass(frozen=True)
class Wait:
    """A waiter's ticket as ``batch.lua``'s ``w`` op takes it (``batch.rs``'s ``WaitArgs``): its name
    (``<channel>#<n>``), priority (0 to 255, higher first), flow and the lease of its place in the queue."""

    ticket: str
    priority: int
    flow: str
    lease_ms: int
    # A release may hand the waiter the slot (one key, an id of the wait's own): ``records.rs``'s flags 8.
    handoff: bool = False


def waiting(
    keys: Sequence[str], id: str | None, ticket: str, priority: int, flow: str, lease_ms: int
) -> tuple[str | None, Wait]:
    """A wait's id and ticket as its asks carry them. On one key (of either layout), without an id of the
    caller's, a release may hand the waiter the slot, under an id of the wait's own, the same at every ask
    (as the Rust library's waiters: ``wait.rs``)."""
    handoff = id is None and len(keys) == 1
    return (_keys.new_id() if handoff else id), Wait(ticket, priority, flow, lease_ms, handoff)


class Queued(TooManyRequests):
    """``batch.lua``'s decision WAITS: the key is full and the waiter's ticket is in its queue (taken, or its
    lease renewed). The waiting acquires' own: they wait for their turn, and time out with the plain
    :class:`TooManyRequests` this is."""


def acquire_args(
    keys: Sequence[str],
    id: str,
    weight: int,
    lease_ms: int,
    limits: Sequence[ClassLimits],
    generated: bool = False,
    wait: Wait | None = None,
    holder: str | None = None,
) -> list[Arg]:
    """``batch.lua``'s ARGV for one admission (``batch.rs`` sends the same records): clock offset, then the
    record: its head (``a`` and its flags: 1 the id was generated for it, whose lease then need not record
    its token; 2 a waiter's standing follows; 8 (with 2) a release may hand it the slot; 16 a label
    follows; ``x`` and the number of keys when several), the keys' places, member, terms (weight, lease,
    0: the lease keeps the token it gets, each key's limits); a waiter's (``wait``) ticket,
    ``level:flow_weight``, flow and ticket lease; the label (``holder``) of its lease and ticket, which
    ``holders.lua`` lists (``records.rs``'s flags 16)."""
    flags = (1 if generated else 0) | (16 if holder is not None else 0)
    if wait is not None:
        flags |= 10 if wait.handoff else 2
    args: list[Arg] = [0, head("a", flags, len(keys)), *range(1, len(keys) + 1)]
    args.append(_keys.member(id))
    args.append(" ".join([str(weight), str(lease_ms), "0"] + [f"{c.default} {c.max}" for c in limits]))
    if wait is not None:
        args.extend([wait.ticket, f"{wait.priority}:1", wait.flow, wait.lease_ms])
    if holder is not None:
        args.append(holder)
    return args


def head(kind: str, flags: int, keys: int) -> str:
    """A record's head as ``batch.lua`` reads it: ``a1`` (an acquire, flags 1, one key), ``r0x3``,
    ``a13`` (flags 16 | 2 | 1); the flags in hex."""
    return f"{kind}{flags:x}" if keys == 1 else f"{kind}{flags:x}x{keys}"


def lone(args: Sequence[Arg]) -> bool:
    """Whether ``lone.lua`` may take the call (the manifest's ``lone``): one record, an admission without a
    standing or a label (flags 0 or 1) or a release, on one key. It answers nothing when it does not, and
    the call goes to ``batch.lua``. (A labelled admission never goes to it: ``lone.lua`` reads no label.)"""
    return args[1] in ("a0", "a1", "r0")


class Passed:
    """Keys ``lone.lua`` passed on lately (a queue, mostly): their next ``SKIP`` lone calls go straight to
    ``batch.lua``, sparing each a round trip that would pass again (``batch.rs``'s ``Passed``). A hint only:
    either way the answer is the same, so threads racing on it lose nothing."""

    SKIP = 64
    MOST = 1024  # keys remembered at most: past it, all are forgotten at once

    def __init__(self) -> None:
        self._keys: dict[str, int] = {}

    def may_take(self, key: str) -> bool:
        left = self._keys.get(key)
        if left is None:
            return True
        if left <= 1:
            self._keys.pop(key, None)
        else:
            self._keys[key] = left - 1
        return False

    def note(self, key: str) -> None:
        if len(self._keys) >= self.MOST:
            self._keys.clear()
        self._keys[key] = self.SKIP


def leave_args(keys: Sequence[str], ticket: str, id: str | None = None) -> list[Arg]:
    """``batch.lua``'s ARGV for a waiter giving up its ticket on ``keys`` (an ``l`` record); with the
    wait's ``id`` (flags 8), a slot a release handed it is released if the ticket is no longer queued."""
    args: list[Arg] = [0, head("l", 0 if id is None else 8, len(keys)), *range(1, len(keys) + 1), ticket]
    return args if id is None else [*args, _keys.member(id)]


def release_args(keys: Sequence[str], id: str, token: int = 0) -> list[Arg]:
    """``batch.lua``'s ARGV for one release (an ``r`` record): of the admission that got ``token`` (0: the
    id's lease)."""
    return [0, head("r", 0, len(keys)), *range(1, len(keys) + 1), _keys.member(id), check_token(token)]


def renew_args(
    id: str, lease_ms: int, readd: int, limits: Sequence[ClassLimits], token: int = 0
) -> list[Arg]:
    """``renew.lua``'s ARGV: member, lease ms, weight to re-add with, clock offset, token, ``'default max'``
    each."""
    args: list[Arg] = [_keys.member(id), lease_ms, readd, 0, check_token(token)]
    args.extend(f"{c.default} {c.max}" for c in limits)
    return args


def check_token(token: object) -> int:
    """A token as the scripts take it: a whole number from 0 (0: any admission's lease)."""
    return _input.token(token)


def status_call(prefix: str, key: str, limits: ClassLimits, change: str) -> tuple[list[str], list[Arg]]:
    """``status.lua``'s KEYS and ARGV; ``change``: '' keep, '0' clear, 'n' set."""
    keys = [*_keys.names(prefix, key), f"{prefix}overrides", f"{prefix}overrides:version"]
    args: list[Arg] = [limits.default, limits.max, change, 0, key, f"{prefix}overrides"]
    return keys, args


def ints(reply: object, n: int) -> list[int]:
    if not isinstance(reply, list) or len(reply) != n or not all(isinstance(x, int) for x in reply):
        raise UnexpectedAnswer(f"expected {n} numbers from a script, got {reply!r}")
    return [int(x) for x in reply]


def admission(
    reply: object, keys: Sequence[str], weight: int, policy: Policy | None = None
) -> tuple[int | None, int, int | None, int]:
    """Reads an admission's :class:`Answer`: (limit, in_flight, expires_at_ms, token), ``expires_at_ms``
    None when the keys are unlimited (nothing recorded); raises the refusal: a waiter's is :class:`Queued`
    (its ticket waits in the refusing key's queue) or :class:`TooManyWaiters` (the queue is at its bound).
    A refusal names the refusing key's class by ``policy`` (``key_class``; ``None`` without one)."""
    answer = Answer(*ints(reply, len(Answer._fields)))
    limit, in_flight, key = answer.limit, answer.in_flight, keys[answer.index]
    if answer.decision == ADMITTED:
        return limit or None, in_flight, answer.expires_at_ms, answer.token
    if answer.decision == UNLIMITED:
        return None, 0, None, 0
    key_class = None if policy is None else policy.class_of(key)
    if answer.decision == FULL:
        raise TooManyRequests(limit, in_flight, key, key_class=key_class)
    if answer.decision == TOO_HEAVY:
        raise WeightExceedsLimit(limit, weight, key, key_class=key_class)
    if answer.decision == WAITS:
        raise Queued(limit, in_flight, key, key_class=key_class)
    if answer.decision == WAITERS_BOUND:
        raise TooManyWaiters(limit, in_flight, key, key_class=key_class)
    raise UnexpectedAnswer(f"acquire answered decision {answer.decision}")


def status(reply: object, key: str, numbers: int = 3) -> KeyStatus:
    """``dify.lua``'s answer (3 numbers), or ``status.lua``'s (4: the last, the version of the Rust processes'
    index of overrides after a change, is theirs)."""
    limit, override, in_flight = ints(reply, numbers)[:3]
    return KeyStatus(key, limit or None, override or None, in_flight)


def change_arg(limit: object) -> str:
    """``limit`` as the scripts take it; refused unless every client can read it back (``common.lua``)."""
    if limit is None:
        return ""
    return str(_input.limit(limit))
