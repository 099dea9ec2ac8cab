"""``HttpLimiter``: the same sync API over ``inflight serve``'s HTTP API, with the standard library only."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from email.message import Message
from types import TracebackType
from typing import Any, TypeVar

from . import _core, _input, _refusal
from ._errors import (
    InflightError,
    Revoked,
    StoreError,
    TooManyRequests,
    TooManyWaiters,
    UnexpectedAnswer,
    WeightExceedsLimit,
)
from ._permit import GuardedStream, Held, Holders, Permit, Renewer

T = TypeVar("T")


class HttpError(InflightError):
    """The server refused the request: ``status`` and the API's error ``code``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        self.status = status
        self.code = code
        super().__init__(f"{status} {code}: {message}")


def _quote(part: str) -> str:
    return urllib.parse.quote(part, safe="")


def _excerpt(raw: bytes) -> str:
    text = raw[:200].decode("utf-8", errors="replace")
    return text + ("..." if len(raw) > 200 else "")


class _Answer:
    """A JSON object the server answered, read field by field: a field missing or of the wrong type is
    :class:`UnexpectedAnswer`, never a ``KeyError`` or ``TypeError`` from the reader."""

    def __init__(self, status: int, value: object, what: str) -> None:
        if not isinstance(value, dict):
            raise UnexpectedAnswer(f"{what}: expected a JSON object, got {value!r:.200}", status)
        self.status = status
        self.value = value
        self.what = what

    def _wrong(self, field: str, expected: str) -> UnexpectedAnswer:
        got = self.value.get(field, "nothing")
        return UnexpectedAnswer(f"{self.what}: {field!r} must be {expected}, got {got!r:.100}", self.status)

    def integer(self, field: str, default: int | None = None) -> int:
        value = self.value.get(field, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self._wrong(field, "a whole number")
        return value

    def integer_or_none(self, field: str) -> int | None:
        """A field that may be ``null`` (or absent)."""
        value = self.value.get(field)
        if value is None:
            return None
        return self.integer(field)

    def text(self, field: str) -> str:
        value = self.value.get(field)
        if not isinstance(value, str):
            raise self._wrong(field, "a string")
        return value

    def objects(self, field: str) -> list[_Answer]:
        value = self.value.get(field)
        if not isinstance(value, list) or not value:
            raise self._wrong(field, "a non-empty list")
        return [_Answer(self.status, item, f"{self.what}: {field}") for item in value]


def _queued(permit: Permit, headers: Message) -> Permit:
    """``permit`` with the key it queued on (``queued_on``, ``queued_class``), as the server's 201 names it
    after a wait (``Inflight-Limit``); a header this client cannot read is left unread."""
    named = _refusal.read_limit_header(headers.get("Inflight-Limit"))
    if named is not None:
        permit.queued_on, permit.queued_class = named.key, named.key_class
    return permit


class HttpLimiter:
    """Permits from ``inflight serve`` at ``base_url`` (``http://host:port``), for processes that cannot
    reach Redis. ``token`` is the admin token that changing limits needs (when the server has one).
    Leases are renewed by one background thread per limiter, as with :class:`RedisLimiter`."""

    def __init__(
        self, base_url: str, token: str | None = None, lease: float = 30.0, timeout: float = 10.0
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.lease_ms = _core.to_lease_ms(lease)
        self.timeout = timeout
        self._holders = Holders()
        siblings = self._holders.siblings
        self._renewer = Renewer(self._renew_held, self._release_held, "inflight-http-renewer", siblings)

    @staticmethod
    def _waits(body: dict[str, Any]) -> float:
        """How long the server may wait before it answers an acquire."""
        return int(body.get("wait_ms", 0)) / 1000

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None = None, waits: float = 0.0
    ) -> tuple[int, Any]:
        """The status and the JSON answer (``None`` for an empty body). An error status comes back as
        ``(status, {"code": ..., "message": ...})``; a body that is not JSON, or an error that is not the
        API's error object, is :class:`UnexpectedAnswer`."""
        status, answer, _ = self._exchange(method, path, body, waits)
        return status, answer

    def _exchange(
        self, method: str, path: str, body: dict[str, Any] | None = None, waits: float = 0.0
    ) -> tuple[int, Any, Message]:
        """:meth:`_request`'s status and answer, and the answer's headers."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token is not None:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout + waits) as response:
                status, raw, headers = response.status, response.read(), response.headers
        except urllib.error.HTTPError as error:
            status, raw, headers = error.code, error.read(), error.headers
        except (urllib.error.URLError, OSError, http.client.IncompleteRead) as error:
            raise StoreError(f"{method} {path}: {error}") from error
        except http.client.HTTPException as error:  # not HTTP at all (BadStatusLine, ...)
            raise UnexpectedAnswer(f"{method} {path}: not an HTTP answer: {error!r}") from error
        try:
            answer = json.loads(raw) if raw.strip() else None
        except ValueError:  # JSONDecodeError, UnicodeDecodeError
            raise UnexpectedAnswer(
                f"{method} {path}: {status} with a body that is not JSON: {_excerpt(raw)!r}", status
            ) from None
        if status >= 400:
            _Answer(status, answer, f"{method} {path}: the error {status}").text("code")
        return status, answer, headers

    @staticmethod
    def _refusal(status: int, answer: Any, key: str, weight: int) -> InflightError:
        answer = answer if isinstance(answer, dict) else {}
        code, message = str(answer.get("code", "")), str(answer.get("message", ""))
        key = str(answer.get("key", key))
        # (The refusing limit's class and figures, which the server's 429 names.)
        key_class = answer.get("class")
        key_class = key_class if isinstance(key_class, str) else None
        limit, in_flight = (
            value if isinstance(value, int) and not isinstance(value, bool) else None
            for value in (answer.get("limit"), answer.get("in_flight"))
        )
        if code == "too_many_requests":
            return TooManyRequests(limit, in_flight, key, key_class=key_class)
        if code == "too_many_waiters":
            return TooManyWaiters(limit, in_flight, key, key_class=key_class)
        if code == "weight_exceeds_limit":
            return WeightExceedsLimit(limit, weight, key, key_class=key_class)
        if code == "revoked":
            return Revoked(key)
        if code == "store_unavailable":
            return StoreError(message)
        if status < 400:
            return UnexpectedAnswer(f"status {status} where the API answers otherwise", status)
        return HttpError(status, code, message)

    def try_acquire(
        self,
        key: str,
        id: str | None = None,
        weight: int = 1,
        lease: float | None = None,
        *,
        holder: str | None = None,
    ) -> Permit:
        """``POST /v1/keys/{key}/permits``; ``holder``, the body's ``"holder"`` (as
        :meth:`RedisLimiter.try_acquire`'s)."""
        return self._acquire_one(_input.key(key), self._terms(id, weight, lease, holder))

    def acquire(
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
    ) -> Permit:
        """``POST /v1/keys/{key}/permits`` with ``wait_ms``, ``priority`` and ``flow``: the server waits
        (at most 300 s) in the key's queue of waiters, as :meth:`RedisLimiter.acquire` does; the request's
        timeout is the limiter's ``timeout`` past ``max_wait``. A waiter an admin revokes ends with
        :class:`Revoked` (the server's 409 ``revoked``)."""
        key = _input.key(key)
        return self._acquire_one(
            key, {**self._terms(id, weight, lease, holder), **self._queue(max_wait, priority, flow)}
        )

    def acquire_all(
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
    ) -> Permit:
        """``POST /v1/permits`` with ``wait_ms``, ``priority`` and ``flow``."""
        unique = _core.unique_keys(keys)
        return self._acquire_all(
            unique, {**self._terms(id, weight, lease, holder), **self._queue(max_wait, priority, flow)}
        )

    def _acquire_one(self, key: str, body: dict[str, Any]) -> Permit:
        weight = int(body["weight"])
        path = f"/v1/keys/{_quote(key)}/permits"
        status, answer, headers = self._exchange("POST", path, body, self._waits(body))
        if status != 201:
            raise self._refusal(status, answer, key, weight)
        permit = _Answer(status, answer, "POST .../permits")
        path = f"/v1/keys/{_quote(key)}/permits/{_quote(permit.text('id'))}"
        limit, in_flight = permit.integer_or_none("limit"), permit.integer("in_flight")
        return _queued(self._permit((key,), permit, limit, in_flight, path, body), headers)

    def try_acquire_all(
        self,
        keys: Sequence[str],
        id: str | None = None,
        weight: int = 1,
        lease: float | None = None,
        *,
        holder: str | None = None,
    ) -> Permit:
        """``POST /v1/permits``: every key or none."""
        unique = _core.unique_keys(keys)
        return self._acquire_all(unique, self._terms(id, weight, lease, holder))

    def _acquire_all(self, unique: tuple[str, ...], body: dict[str, Any]) -> Permit:
        weight = int(body["weight"])
        sent = {"keys": list(unique), **body}
        status, answer, headers = self._exchange("POST", "/v1/permits", sent, self._waits(body))
        if status != 201:
            raise self._refusal(status, answer, unique[0], weight)
        permit = _Answer(status, answer, "POST /v1/permits")
        first = permit.objects("keys")[0]
        path = f"/v1/permits/{_quote(permit.text('id'))}"
        limit, in_flight = first.integer_or_none("limit"), first.integer("in_flight")
        return _queued(self._permit(unique, permit, limit, in_flight, path, body), headers)

    def _terms(self, id: str | None, weight: int, lease: float | None, holder: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "weight": _core.check_weight(weight),
            "lease_ms": self.lease_ms if lease is None else _core.to_lease_ms(lease),
        }
        if id is not None:
            body["id"] = _core.check_id(id)
        holder = _input.holder(holder)
        if holder is not None:
            body["holder"] = holder
        return body

    @staticmethod
    def _queue(max_wait: float, priority: int, flow: str) -> dict[str, Any]:
        """A waiting acquire's ``wait_ms`` and its place in the queue (``priority``, ``flow``)."""
        return {
            "wait_ms": _input.max_wait_ms(max_wait),
            "priority": _input.priority(priority),
            "flow": _input.flow(flow),
        }

    def _permit(
        self,
        keys: tuple[str, ...],
        answer: _Answer,
        limit: int | None,
        in_flight: int,
        path: str,
        body: dict[str, Any],
    ) -> Permit:
        expires = answer.integer_or_none("lease_expires_at_ms")
        id, weight = answer.text("id"), answer.integer("weight", body["weight"])
        token = answer.integer("token", 0)
        if expires is None:  # unlimited: nothing held
            return Permit(keys, id, weight, None, in_flight, None, None, None)
        lease_ms = int(body["lease_ms"])
        held = Held(keys, id, weight, lease_ms, (), expires_at_ms=expires, token=token, extra=path)
        self._holders.add(held)
        self._renewer.add(held)
        return Permit(keys, id, weight, limit, in_flight, expires, held, self._renewer)

    def _renew_held(self, held: Held) -> bool:
        renewal = {"lease_ms": held.lease_ms, "token": self._holders.token(held)}
        status, answer = self._request("PUT", str(held.extra), renewal)
        if status == 200:
            held.expires_at_ms = (
                _Answer(status, answer, "PUT .../permits/{id}").integer_or_none("lease_expires_at_ms") or 0
            )
            return True
        if status == 404:
            return False
        raise self._refusal(status, answer, held.keys[0], held.weight)

    def _release_held(self, held: Held) -> None:
        last, token = self._holders.count_out(held)
        if not last:
            return  # another permit of this process holds the lease under the same id
        status, answer = self._request("DELETE", f"{held.extra}?token={token}")
        if status not in (200, 204):
            raise self._refusal(status, answer, held.keys[0], held.weight)

    def release(self, key: str, id: str, token: int = 0) -> bool:
        """``DELETE /v1/keys/{key}/permits/{id}`` (released, or already gone); with a ``token``, only the
        lease of the admission that got it."""
        key, id, token = _input.key(key), _input.id(id), _input.token(token)
        path = f"/v1/keys/{_quote(key)}/permits/{_quote(id)}?token={token}"
        status, answer = self._request("DELETE", path)
        if status not in (200, 204):
            raise self._refusal(status, answer, key, 1)
        return True

    def status(self, key: str) -> _core.KeyStatus:
        """``GET /v1/keys/{key}`` (the HTTP API does not say the override: ``override`` is None)."""
        key = _input.key(key)
        status, answer = self._request("GET", f"/v1/keys/{_quote(key)}")
        if status != 200:
            raise self._refusal(status, answer, key, 1)
        read = _Answer(status, answer, "GET /v1/keys/{key}")
        return _core.KeyStatus(key, read.integer_or_none("limit"), None, read.integer("in_flight"))

    def set_limit(self, key: str, limit: int) -> _core.KeyStatus:
        """``PUT /v1/keys/{key}/limit``; 0 clears the override."""
        key, limit = _input.key(key), _input.limit(limit)
        status, answer = self._request("PUT", f"/v1/keys/{_quote(key)}/limit", {"limit": limit})
        if status != 200:
            raise self._refusal(status, answer, key, 1)
        read = _Answer(status, answer, "PUT /v1/keys/{key}/limit")
        return _core.KeyStatus(key, read.integer_or_none("limit"), limit or None, read.integer("in_flight"))

    def clear_limit(self, key: str) -> _core.KeyStatus:
        return self.set_limit(key, 0)

    def guard_stream(self, permit: Permit, iterable: Iterable[T]) -> GuardedStream[T]:
        return GuardedStream(permit, iterable)

    def close(self) -> None:
        self._renewer.close()

    def __enter__(self) -> HttpLimiter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
