"""What a caller may give the client: one table of rules, the server's own, used by every limiter.

From ``crates/inflight-server/src/api/input.rs`` (``check_name``, ``lease``, ``options``), ``permits.rs``
(``MAX_KEYS``), ``limits.rs`` (an override is a ``u32``) and the library's ``options.rs`` (``MIN_LEASE``,
``MAX_LEASE``; a weight is a ``u32``, at least 1):

========  =======================================================================================
key       a ``str`` of 1 to 256 bytes of UTF-8, without control characters (Unicode ``Cc``, Rust's
          ``char::is_control``)
id        the same as a key (``None``: a generated UUID)
keys      a sequence (not one string) of 1 to 16 distinct keys; repeated keys count once
weight    an ``int`` (not a ``bool``) from 1 to 2**32 - 1
lease     seconds, an ``int`` or ``float`` (not a ``bool``), finite; rounded to whole ms, 100 ms to 24 h
limit     an ``int`` (not a ``bool``) from 0 (none, or clear) to 2**32 - 1
token     an ``int`` (not a ``bool``) from 0 (any admission) to 2**63 - 1 (the store's integers)
age       seconds as a lease, 1 ms to 24 h (``dify_stale_after``)
max_wait  seconds, an ``int`` or ``float`` (not a ``bool``), finite; rounded to whole ms, 0 (do not
          wait) to 300 s (the API's ``wait_ms``, ``input.rs``'s ``MAX_WAIT``)
priority  an ``int`` (not a ``bool``) from 0 to 255, higher first (the API's ``"priority"``, a ``u8``)
flow      a ``str`` of at most 256 bytes of UTF-8, any characters, ``""`` included (the API's ``"flow"``,
          ``input.rs``'s ``queue``)
holder    a ``str`` of 1 to 128 bytes of UTF-8, without control characters (``None``: no label; the
          API's ``"holder"``, ``input.rs``'s ``holder``, the library's ``MAX_HOLDER_LEN``)
========  =======================================================================================

A value of the wrong type raises ``TypeError``; one out of range, ``ValueError``. Never an
``InflightError``: the store was not asked.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

MAX_NAME_BYTES = 256
MAX_KEYS = 16
MIN_LEASE_MS = 100  # the library's MIN_LEASE: renewed at a third, a shorter lease lapses while held
MAX_LEASE_MS = 24 * 3600 * 1000  # MAX_LEASE
MAX_WEIGHT = 2**32 - 1  # a u32
MAX_LIMIT = 2**32 - 1  # a u32: what every process reads back (common.lua refuses larger overrides)
MAX_TOKEN = 2**63 - 1  # a Redis integer
MAX_WAIT_MS = 300_000  # the API's MAX_WAIT
MAX_PRIORITY = 255  # a u8
MAX_FLOW_BYTES = 256  # the library's MAX_FLOW_LEN
MAX_HOLDER_BYTES = 128  # the library's MAX_HOLDER_LEN


def _type_name(value: object) -> str:
    return type(value).__name__


def _whole(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {_type_name(value)}")
    return value


def _control(text: str) -> bool:
    # Unicode's Cc: C0, DEL and C1 (Rust's char::is_control).
    return any(c < " " or "\x7f" <= c <= "\x9f" for c in text)


def name(value: object, what: str = "a key", most: int = MAX_NAME_BYTES) -> str:
    """A key or an id: 1 to 256 bytes (``most``) of UTF-8, no control characters."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {_type_name(value)}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(f"{what} must be valid UTF-8 (no lone surrogates): {value!r}") from None
    if size == 0:
        raise ValueError(f"{what} may not be empty")
    if size > most:
        raise ValueError(f"{what} is at most {most} bytes, not {size}")
    if _control(value):
        raise ValueError(f"{what} may not contain control characters: {value!r}")
    return value


def key(value: object) -> str:
    return name(value, "a key")


def id(value: object) -> str:
    """A given permit id (``None`` is the caller's to handle: a generated id)."""
    return name(value, "an id")


def keys(values: object) -> tuple[str, ...]:
    """The keys once each, in order; 1 to 16 of them."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"keys must be a sequence of keys, not {_type_name(values)}")
    out: list[str] = []
    for value in values:
        checked = key(value)
        if checked not in out:
            out.append(checked)
        if len(out) > MAX_KEYS:
            raise ValueError(f"at most {MAX_KEYS} keys at once")
    if not out:
        raise ValueError("no keys")
    return tuple(out)


def weight(value: object) -> int:
    weight = _whole(value, "weight")
    if not 1 <= weight <= MAX_WEIGHT:
        raise ValueError(f"weight must be from 1 to {MAX_WEIGHT}, not {weight}")
    return weight


def _seconds_ms(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be seconds (an int or a float), not {_type_name(value)}")
    if not math.isfinite(value):
        raise ValueError(f"{what} must be finite, not {value!r}")
    return round(value * 1000)


def lease_ms(value: object) -> int:
    """A lease in seconds, as whole ms: 100 ms (a shorter one lapses before its renewal comes) to 24 h."""
    ms = _seconds_ms(value, "lease")
    if not MIN_LEASE_MS <= ms <= MAX_LEASE_MS:
        raise ValueError(f"lease must be between 100 ms and 24 h, not {value!r} s")
    return ms


def age_ms(value: object) -> int:
    """An age (``dify_stale_after``) in seconds, as whole ms: 1 ms to 24 h."""
    ms = _seconds_ms(value, "an age")
    if not 1 <= ms <= MAX_LEASE_MS:
        raise ValueError(f"an age must be between 1 ms and 24 h, not {value!r} s")
    return ms


def max_wait_ms(value: object) -> int:
    """How long a waiting acquire may wait, in seconds, as whole ms: 0 (not at all) to 300 s."""
    ms = _seconds_ms(value, "max_wait")
    if not 0 <= ms <= MAX_WAIT_MS:
        raise ValueError(f"max_wait must be between 0 and 300 s, not {value!r} s")
    return ms


def priority(value: object) -> int:
    """A waiter's priority level: 0 to 255, higher first."""
    level = _whole(value, "priority")
    if not 0 <= level <= MAX_PRIORITY:
        raise ValueError(f"priority must be from 0 to {MAX_PRIORITY}, not {level}")
    return level


def flow(value: object) -> str:
    """A waiter's flow (served in turn with the other flows of its priority): at most 256 bytes."""
    if not isinstance(value, str):
        raise TypeError(f"flow must be a str, not {_type_name(value)}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(f"flow must be valid UTF-8 (no lone surrogates): {value!r}") from None
    if size > MAX_FLOW_BYTES:
        raise ValueError(f"flow is at most {MAX_FLOW_BYTES} bytes, not {size}")
    return value


def holder(value: object) -> str | None:
    """A permit's label, listed with its lease or ticket (``None``: none): 1 to 128 bytes of UTF-8, no
    control characters."""
    if value is None:
        return None
    return name(value, "holder", MAX_HOLDER_BYTES)


def limit(value: object, what: str = "a limit") -> int:
    """A limit or an override: 0 (none; for an override, clear it) to 2**32 - 1."""
    limit = _whole(value, what)
    if not 0 <= limit <= MAX_LIMIT:
        raise ValueError(f"{what} must be a whole number from 0 to {MAX_LIMIT}, not {limit}")
    return limit


def token(value: object) -> int:
    """A fencing token: 0 (whichever lease the id holds) to 2**63 - 1."""
    token = _whole(value, "token")
    if not 0 <= token <= MAX_TOKEN:
        raise ValueError(f"token must be a whole number from 0 to {MAX_TOKEN}, not {token}")
    return token
