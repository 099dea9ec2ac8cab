"""The 429 answer of the ASGI and WSGI middleware: the same JSON error object as inflight's other HTTP
answers (``{"code", "message", "status"}``), naming the key, its limit and its in-flight count, with
``Retry-After`` and ``Inflight-Limit`` headers."""

from __future__ import annotations

import json
import string
from dataclasses import dataclass

from ._errors import TooManyRequests, TooManyWaiters, WeightExceedsLimit

STATUS = 429
REASON = "Too Many Requests"
RETRY_AFTER = 1  # whole seconds, as the Rust library's hint: holders release when their work ends

Refused = TooManyRequests | WeightExceedsLimit
REFUSALS = (TooManyRequests, WeightExceedsLimit)  # what answers 429 (TooManyWaiters is a TooManyRequests)

# RFC 9651's sf-string characters (printable ASCII); a key with any other is a Display String.
_PLAIN = frozenset(string.printable) - frozenset("\t\n\r\x0b\x0c")


@dataclass(frozen=True)
class Answer:
    """The 429: its headers (latin-1 text, ASCII in fact) and its JSON body."""

    headers: list[tuple[str, str]]
    body: bytes


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


def limit_header(key: str, limit: int | None, in_flight: int | None) -> str:
    """``Inflight-Limit: key="app:a1"; limit=5; in_flight=5``; a figure the refusal lacks is left out."""
    parts = [f"key={sf_string(key)}"]
    if limit is not None:
        parts.append(f"limit={limit}")
    if in_flight is not None:
        parts.append(f"in_flight={in_flight}")
    return "; ".join(parts)


def answer(refused: Refused) -> Answer:
    """The 429 for a refusal of the limiter's."""
    in_flight = refused.in_flight if isinstance(refused, TooManyRequests) else None
    if isinstance(refused, TooManyWaiters):
        code, message = "too_many_waiters", "The key's queue of waiters is full; try again later."
    elif isinstance(refused, TooManyRequests):
        code, message = "too_many_requests", "Too many requests in flight on this key; try again later."
    else:
        code, message = "weight_exceeds_limit", "The key's limit admits no request at all."
    body = {
        "code": code,
        "message": message,
        "status": STATUS,
        "key": refused.key,
        "limit": refused.limit,
        "in_flight": in_flight,
    }
    raw = json.dumps(body).encode()
    headers = [
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(raw))),
        ("Retry-After", str(RETRY_AFTER)),
        ("Inflight-Limit", limit_header(refused.key, refused.limit, in_flight)),
    ]
    return Answer(headers, raw)
