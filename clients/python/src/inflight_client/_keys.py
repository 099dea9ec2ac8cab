"""Redis key names and permit ids, exactly as inflight's Rust store writes them (``naming.rs``, ``id.rs``).

A user key ``K`` lives in ``<prefix>{E}:leases``, ``:permits`` and ``:limit``, where ``E`` is ``K`` with
``{``, ``}``, ``%`` and control characters percent-encoded (the empty key is ``%``). A permit id that is a
UUID is stored as the byte 0xFF and its 16 bytes; any other id as its UTF-8 text.
"""

from __future__ import annotations

import unicodedata
import uuid

_ESCAPED = {"{": "%7B", "}": "%7D", "%": "%25"}


def escape(key: str) -> str:
    """The key as it appears inside the hash tag."""
    if not key:
        return "%"
    out: list[str] = []
    for c in key:
        if c in _ESCAPED:
            out.append(_ESCAPED[c])
        elif unicodedata.category(c) == "Cc":  # Rust's char::is_control
            out.extend(f"%{b:02X}" for b in c.encode("utf-8"))
        else:
            out.append(c)
    return "".join(out)


def tag(prefix: str, key: str) -> str:
    """``<prefix>{<escaped key>}``."""
    return f"{prefix}{{{escape(key)}}}"


def names(prefix: str, key: str) -> tuple[str, str, str]:
    """The key's three Redis keys, in the order the scripts read them: leases, permits, limit."""
    t = tag(prefix, key)
    return f"{t}:leases", f"{t}:permits", f"{t}:limit"


def as_uuid(id: str) -> uuid.UUID | None:
    """The UUID an id spells canonically (lower case, hyphenated), as Rust's ``PermitId::from`` reads it."""
    if len(id) != 36:
        return None
    try:
        u = uuid.UUID(id)
    except ValueError:
        return None
    return u if str(u) == id else None


def member(id: str) -> bytes:
    """The bytes Redis stores for a permit id."""
    u = as_uuid(id)
    if u is not None:
        return b"\xff" + u.bytes
    return id.encode("utf-8")


def new_id() -> str:
    """A generated id: a UUID v4 (its text; stored as 17 bytes)."""
    return str(uuid.uuid4())
