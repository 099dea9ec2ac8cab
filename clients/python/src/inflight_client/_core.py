"""The scripts' arguments and answers, shared by the sync and asyncio limiters (``batch.rs``, ``mod.rs``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources

from . import _keys
from ._errors import StoreError, TooManyRequests, WeightExceedsLimit
from ._policy import ClassLimits

MAX_KEYS = 16
MAX_LEASE_MS = 24 * 3600 * 1000
# The shortest lease, as the Rust library's MIN_LEASE: renewed at a third, a shorter one lapses while held.
MIN_LEASE_MS = 100
# The largest override (2**32 - 1): what the Rust processes read; larger values read as none.
MAX_OVERRIDE = 2**32 - 1

Arg = str | bytes | int


def script_text(name: str) -> str:
    """The script as inflight runs it: ``common.lua`` followed by its own file (``scripts.rs``)."""
    folder = resources.files("inflight_client") / "scripts"
    return (folder / "common.lua").read_text("utf-8") + (folder / name).read_text("utf-8")


@dataclass(frozen=True)
class KeyStatus:
    """A key's effective limit (``None``: unlimited), its override (``None``: none) and in-flight count."""

    key: str
    limit: int | None
    override: int | None
    in_flight: int


def to_lease_ms(lease: float) -> int:
    """A lease in ms: 100 ms (``MIN_LEASE_MS``: a shorter one lapses before its renewal comes) to 24 h."""
    ms = round(lease * 1000)
    if not MIN_LEASE_MS <= ms <= MAX_LEASE_MS:
        raise ValueError(f"lease must be between 100 ms and 24 h, not {lease!r} s")
    return ms


def to_age_ms(age: float) -> int:
    """An age (``dify_stale_after``) in ms: 1 ms to 24 h."""
    ms = round(age * 1000)
    if not 1 <= ms <= MAX_LEASE_MS:
        raise ValueError("an age must be between 1 ms and 24 h")
    return ms


def check_weight(weight: int) -> int:
    if not isinstance(weight, int) or weight < 1:
        raise ValueError("weight must be at least 1")
    return weight


def check_id(id: str | None) -> str:
    if id is None:
        return _keys.new_id()
    if not isinstance(id, str) or not id:
        raise ValueError("id must be a non-empty string")
    return id


def unique_keys(keys: Iterable[str]) -> tuple[str, ...]:
    """The keys once each, in order; 1 to 16 of them."""
    if isinstance(keys, str):
        raise TypeError("keys must be a sequence of keys, not one string")
    out: list[str] = []
    for key in keys:
        if not isinstance(key, str):
            raise TypeError(f"a key must be a string, not {type(key).__name__}")
        if key not in out:
            out.append(key)
        if len(out) > MAX_KEYS:
            raise ValueError("at most 16 keys at once")
    if not out:
        raise ValueError("no keys")
    return tuple(out)


def key_names(prefix: str, keys: Sequence[str]) -> list[str]:
    out: list[str] = []
    for key in keys:
        out.extend(_keys.names(prefix, key))
    return out


def acquire_args(
    keys: Sequence[str], id: str, weight: int, lease_ms: int, limits: Sequence[ClassLimits]
) -> list[Arg]:
    """``batch.lua``'s ARGV for one admission: clock offset, ``a`` (or ``A n``), key places, member, terms,
    and 0 (the lease keeps the token it gets)."""
    args: list[Arg] = [0]
    args.extend(["a"] if len(keys) == 1 else ["A", len(keys)])
    args.extend(range(1, len(keys) + 1))
    args.append(_keys.member(id))
    args.append(" ".join([str(weight), str(lease_ms)] + [f"{c.default} {c.max}" for c in limits]))
    args.append(0)
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


def check_token(token: int) -> int:
    """A token as the scripts take it: a whole number from 0 (0: any admission's lease)."""
    if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < 2**63:
        raise ValueError(f"token must be a whole number from 0 below 2**63, not {token!r}")
    return token


def status_call(prefix: str, key: str, limits: ClassLimits, change: str) -> tuple[list[str], list[Arg]]:
    """``status.lua``'s KEYS and ARGV; ``change``: '' keep, '0' clear, 'n' set."""
    keys = [*_keys.names(prefix, key), f"{prefix}overrides", f"{prefix}overrides:version"]
    args: list[Arg] = [limits.default, limits.max, change, 0, key, f"{prefix}overrides"]
    return keys, args


def ints(reply: object, n: int) -> list[int]:
    if not isinstance(reply, list) or len(reply) != n:
        raise StoreError(f"expected {n} numbers from a script, got {reply!r}")
    return [int(x) for x in reply]


def admission(reply: object, keys: Sequence[str], weight: int) -> tuple[int | None, int, int | None, int]:
    """Reads ``batch.lua``'s answer (``dify.lua``'s: six numbers, no token): (limit, in_flight, expires_at_ms,
    token), ``expires_at_ms`` None when the keys are unlimited (nothing recorded); raises the refusal."""
    numbers = ints(reply, 6 if isinstance(reply, list) and len(reply) == 6 else 11)
    decision, index, limit, in_flight, expires_at_ms = numbers[:5]
    token = numbers[6] if len(numbers) == 11 else 0
    if decision == 1:
        return limit or None, in_flight, expires_at_ms, token
    if decision == 2:
        return None, 0, None, 0
    if decision == 0:
        raise TooManyRequests(limit, in_flight, keys[index])
    if decision == 3:
        raise WeightExceedsLimit(limit, weight, keys[index])
    raise StoreError(f"acquire answered decision {decision}")


def status(reply: object, key: str, numbers: int = 3) -> KeyStatus:
    """``dify.lua``'s answer (3 numbers), or ``status.lua``'s (4: the last, the version of the Rust processes'
    index of overrides after a change, is theirs)."""
    limit, override, in_flight = ints(reply, numbers)[:3]
    return KeyStatus(key, limit or None, override or None, in_flight)


def change_arg(limit: int | None) -> str:
    """``limit`` as the scripts take it; refused unless every client can read it back (``common.lua``)."""
    if limit is None:
        return ""
    if not isinstance(limit, int) or isinstance(limit, bool) or not 0 <= limit <= MAX_OVERRIDE:
        raise ValueError(f"a limit must be a whole number from 0 (clear) to {MAX_OVERRIDE}, not {limit!r}")
    return str(limit)
