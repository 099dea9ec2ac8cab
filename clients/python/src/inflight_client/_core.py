"""The scripts' arguments and answers, shared by the sync and asyncio limiters (``batch.rs``, ``mod.rs``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

from . import _input, _keys
from ._errors import TooManyRequests, TooManyWaiters, UnexpectedAnswer, WeightExceedsLimit
from ._input import MAX_KEYS, MAX_LEASE_MS, MIN_LEASE_MS
from ._input import MAX_LIMIT as MAX_OVERRIDE
from ._policy import ClassLimits

__all__ = ["MAX_KEYS", "MAX_LEASE_MS", "MIN_LEASE_MS", "MAX_OVERRIDE"]

Arg = str | bytes | int


# The scripts that also read a key's queue of waiters (``scripts.rs``).
_QUEUED = ("batch.lua", "status.lua", "dify.lua")


def script_text(name: str) -> str:
    """The script as inflight runs it: ``common.lua`` (and ``queue.lua`` where ``scripts.rs`` adds it)
    followed by its own file."""
    folder = resources.files("inflight_client") / "scripts"
    parts = ["common.lua", "queue.lua", name] if name in _QUEUED else ["common.lua", name]
    return "".join((folder / part).read_text("utf-8") for part in parts)


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


class Queued(TooManyRequests):
    """``batch.lua``'s decision 4: the key is full and the waiter's ticket is in its queue (taken, or its
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
) -> list[Arg]:
    """``batch.lua``'s ARGV for one admission: clock offset, ``a`` (or ``A n``; ``g``/``G`` when the id was
    generated for this admission, whose lease then need not record its token), key places, member, terms,
    and 0 (the lease keeps the token it gets). A waiter's (``wait``) is ``w`` (``W n``), followed by its
    ticket, priority, flow, the ticket's lease and whether the id was generated (1/0), as ``batch.rs``
    sends it."""
    args: list[Arg] = [0]
    kind = "w" if wait is not None else "g" if generated else "a"
    args.extend([kind] if len(keys) == 1 else [kind.upper(), len(keys)])
    args.extend(range(1, len(keys) + 1))
    args.append(_keys.member(id))
    args.append(" ".join([str(weight), str(lease_ms)] + [f"{c.default} {c.max}" for c in limits]))
    args.append(0)
    if wait is not None:
        args.extend([wait.ticket, wait.priority, wait.flow, wait.lease_ms, 1 if generated else 0])
    return args


def leave_args(keys: Sequence[str], ticket: str) -> list[Arg]:
    """``batch.lua``'s ARGV for a waiter giving up its ticket on ``keys`` (``l``, or ``L n``): the ticket
    stands where an id would."""
    args: list[Arg] = [0]
    args.extend(["l"] if len(keys) == 1 else ["L", len(keys)])
    args.extend(range(1, len(keys) + 1))
    args.append(ticket)
    return args


def release_args(keys: Sequence[str], id: str, token: int = 0) -> list[Arg]:
    """``batch.lua``'s ARGV for one release: of the admission that got ``token`` (0: the id's lease)."""
    args: list[Arg] = [0]
    args.extend(["r"] if len(keys) == 1 else ["R", len(keys)])
    args.extend(range(1, len(keys) + 1))
    args.append(_keys.member(id))
    args.append(check_token(token))
    return args


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


def admission(reply: object, keys: Sequence[str], weight: int) -> tuple[int | None, int, int | None, int]:
    """Reads ``batch.lua``'s answer (``dify.lua``'s: seven numbers, no token): (limit, in_flight,
    expires_at_ms, token), ``expires_at_ms`` None when the keys are unlimited (nothing recorded); raises the
    refusal: a waiter's is :class:`Queued` (its ticket waits in the refusing key's queue) or
    :class:`TooManyWaiters` (the queue is at its bound)."""
    numbers = ints(reply, 7 if isinstance(reply, list) and len(reply) == 7 else 12)
    decision, index, limit, in_flight, expires_at_ms = numbers[:5]
    token = numbers[6] if len(numbers) == 12 else 0
    if decision == 1:
        return limit or None, in_flight, expires_at_ms, token
    if decision == 2:
        return None, 0, None, 0
    if decision == 0:
        raise TooManyRequests(limit, in_flight, keys[index])
    if decision == 3:
        raise WeightExceedsLimit(limit, weight, keys[index])
    if decision == 4:
        raise Queued(limit, in_flight, keys[index])
    if decision == 5:
        raise TooManyWaiters(limit, in_flight, keys[index])
    raise UnexpectedAnswer(f"acquire answered decision {decision}")


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
