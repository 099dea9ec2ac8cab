"""The answers of the ASGI and WSGI middleware that the app does not give, as inflight's other HTTP answers
give them (``crates/inflight-tower/src/rejection.rs``): the 429 of a refusal, the JSON error object
(``{"code", "message", "status"}``) naming the key, its class, its limit and its in-flight count, with
``Retry-After`` and ``Inflight-Limit`` headers; the 409 of a revoked waiter; and the ``Inflight-Limit``
header of a response that waited in a key's queue before it was admitted; and the label of ``holder=``."""

from __future__ import annotations

import json
import re
import string
from dataclasses import dataclass

from . import _input
from ._errors import Revoked, TooManyRequests, TooManyWaiters, WeightExceedsLimit
from ._permit import PermitBase, log

STATUS = 429
REASON = "Too Many Requests"
RETRY_AFTER = 1  # whole seconds, as the Rust library's hint: holders release when their work ends
HEADER = "Inflight-Limit"

Refused = TooManyRequests | WeightExceedsLimit
REFUSALS = (TooManyRequests, WeightExceedsLimit)  # what answers 429 (TooManyWaiters is a TooManyRequests)

# RFC 9651's sf-string characters (printable ASCII); a key with any other is a Display String.
_PLAIN = frozenset(string.printable) - frozenset("\t\n\r\x0b\x0c")


@dataclass(frozen=True)
class Answer:
    """An answer of the middleware's own: its status line, headers (latin-1 text, ASCII in fact) and JSON
    body."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes


@dataclass(frozen=True)
class Named:
    """What an ``Inflight-Limit`` header names: the key, its class and the figures it gives (``None``
    where it gives none)."""

    key: str
    key_class: str | None = None
    limit: int | None = None
    in_flight: int | None = None


def sf_string(text: str) -> str:
    """``text`` as a structured-field value (RFC 9651): ``"..."`` with ``\\`` and ``"`` escaped, or, with
    a character outside printable ASCII, a Display String ``%"..."`` (UTF-8, ``%``, ``"`` and every byte
    outside printable ASCII as ``%xx``)."""
    if all(c in _PLAIN for c in text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    out = []
    for byte in text.encode("utf-8"):
        c = chr(byte)
        out.append(f"%{byte:02x}" if c not in _PLAIN or c in '%"' else c)
    return '%"' + "".join(out) + '"'


def limit_header(key: str, key_class: str | None, limit: int | None, in_flight: int | None) -> str:
    """``Inflight-Limit: key="app:a1"; class="app:*"; limit=5; in_flight=5`` (the order of the Rust
    ``limit_header``'s); a class or a figure not known is left out."""
    parts = [f"key={sf_string(key)}"]
    if key_class is not None:
        parts.append(f"class={sf_string(key_class)}")
    if limit is not None:
        parts.append(f"limit={limit}")
    if in_flight is not None:
        parts.append(f"in_flight={in_flight}")
    return "; ".join(parts)


_NAME = re.compile(r"[a-z*][a-z0-9_\-.*]*")
_INTEGER = re.compile(r"-?[0-9]{1,15}")
_HEX = frozenset("0123456789abcdef")


def _string(value: str, at: int) -> tuple[str, int] | None:
    """The sf-string opening at ``value[at]`` (``"``) and the index past it."""
    out: list[str] = []
    at += 1
    while at < len(value):
        c = value[at]
        if c == "\\":
            if at + 1 >= len(value) or value[at + 1] not in '"\\':
                return None
            out.append(value[at + 1])
            at += 2
        elif c == '"':
            return "".join(out), at + 1
        elif c in _PLAIN:
            out.append(c)
            at += 1
        else:
            return None
    return None


def _display_string(value: str, at: int) -> tuple[str, int] | None:
    """The Display String opening at ``value[at]`` (``%"``) and the index past it."""
    out = bytearray()
    at += 2
    while at < len(value):
        c = value[at]
        if c == "%":
            digits = value[at + 1 : at + 3]
            if len(digits) != 2 or not set(digits) <= _HEX:
                return None
            out.append(int(digits, 16))
            at += 3
        elif c == '"':
            try:
                return out.decode("utf-8"), at + 1
            except UnicodeDecodeError:
                return None
        elif c in _PLAIN:
            out.append(ord(c))
            at += 1
        else:
            return None
    return None


def read_limit_header(value: str | None) -> Named | None:
    """An ``Inflight-Limit`` header read back (``key="app:a1"; class="app:*"; limit=5; in_flight=5``,
    RFC 9651 parameters, a key as a Display String too); ``None`` when there is none, it names no key, or
    it is not such a header. Parameters of other names are skipped."""
    if value is None:
        return None
    params: dict[str, str | int] = {}
    at, end = 0, len(value)
    while True:
        while at < end and value[at] in " \t":
            at += 1
        name = _NAME.match(value, at)
        if name is None:
            return None
        at = name.end()
        if value.startswith("=", at):
            at += 1
            if value.startswith('"', at):
                read: tuple[str | int, int] | None = _string(value, at)
            elif value.startswith('%"', at):
                read = _display_string(value, at)
            elif (number := _INTEGER.match(value, at)) is not None:
                read = int(number.group()), number.end()
            else:
                return None
            if read is None:
                return None
            params[name.group()], at = read
        while at < end and value[at] in " \t":
            at += 1
        if at == end:
            break
        if value[at] != ";":
            return None
        at += 1
    key, key_class, limit, in_flight = (params.get(n) for n in ("key", "class", "limit", "in_flight"))
    if not isinstance(key, str):
        return None
    return Named(
        key,
        key_class if isinstance(key_class, str) else None,
        limit if isinstance(limit, int) else None,
        in_flight if isinstance(in_flight, int) else None,
    )


def _json(status: int, reason: str, body: dict[str, object], extra: list[tuple[str, str]]) -> Answer:
    raw = json.dumps(body).encode()
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(raw))), *extra]
    return Answer(status, reason, headers, raw)


def answer(refused: Refused) -> Answer:
    """The 429 for a refusal of the limiter's: the refusing key, its class and its figures, in the body
    and in ``Inflight-Limit`` (as ``inflight serve``'s and the tower layer's 429)."""
    in_flight = refused.in_flight if isinstance(refused, TooManyRequests) else None
    if isinstance(refused, TooManyWaiters):
        code, message = "too_many_waiters", "The key's queue of waiters is full; try again later."
    elif isinstance(refused, TooManyRequests):
        code, message = "too_many_requests", "Too many requests in flight on this key; try again later."
    else:
        code, message = "weight_exceeds_limit", "The key's limit admits no request at all."
    body: dict[str, object] = {
        "code": code,
        "message": message,
        "status": STATUS,
        "key": refused.key,
        "class": refused.key_class,
        "limit": refused.limit,
        "in_flight": in_flight,
    }
    named = limit_header(refused.key, refused.key_class, refused.limit, in_flight)
    return _json(STATUS, REASON, body, [("Retry-After", str(RETRY_AFTER)), (HEADER, named)])


def revoked(error: Revoked) -> Answer:
    """The 409 for a waiter an admin revoked (the tower layer's and ``inflight serve``'s ``revoked``)."""
    body: dict[str, object] = {
        "code": "revoked",
        "message": "An admin revoked this request's place in the queue.",
        "status": 409,
        "key": error.key,
    }
    return _json(409, "Conflict", body, [])


def queued_header(permit: PermitBase) -> tuple[str, str] | None:
    """``Inflight-Limit`` naming the key ``permit`` queued on before it was admitted (``None`` when it did
    not wait), with its class and, when it is the permit's first key, its figures at admission (as
    ``inflight serve``'s 201 after a wait)."""
    key = permit.queued_on
    if key is None:
        return None
    limit = permit.limit if key == permit.key else None
    in_flight = permit.in_flight if limit is not None else None
    return HEADER, limit_header(key, permit.queued_class, limit, in_flight)


def holder_label(label: object) -> str | None:
    """The middleware's ``holder`` label as the limiter takes it (``None``: none); one the limiter would
    refuse is logged and dropped, and the request admitted without a label."""
    try:
        return _input.holder(label)
    except (TypeError, ValueError) as error:
        log.warning("inflight: the request's holder label %.80r is dropped: %s", label, error)
        return None
