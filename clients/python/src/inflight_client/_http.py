"""``HttpLimiter``: the same sync API over ``inflight serve``'s HTTP API, with the standard library only."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, TypeVar

from . import _core
from ._errors import InflightError, StoreError, TooManyRequests, WeightExceedsLimit
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
        self._renewer = Renewer(self._renew_held, self._release_held, name="inflight-http-renewer")
        self._holders = Holders()

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token is not None:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as error:
            raw = error.read()
            try:
                answer = json.loads(raw) if raw else {}
            except ValueError:
                answer = {"message": raw.decode(errors="replace")}
            return error.code, answer
        except (urllib.error.URLError, OSError) as error:
            raise StoreError(f"{method} {path}: {error}") from error

    @staticmethod
    def _refusal(status: int, answer: Any, key: str, weight: int) -> InflightError:
        answer = answer if isinstance(answer, dict) else {}
        code, message = str(answer.get("code", "")), str(answer.get("message", ""))
        key = str(answer.get("key", key))
        if code == "too_many_requests":
            return TooManyRequests(None, None, key)
        if code == "weight_exceeds_limit":
            return WeightExceedsLimit(None, weight, key)
        if code == "store_unavailable":
            return StoreError(message)
        return HttpError(status, code, message)

    def try_acquire(
        self, key: str, id: str | None = None, weight: int = 1, lease: float | None = None
    ) -> Permit:
        """``POST /v1/keys/{key}/permits``."""
        body = self._terms(id, weight, lease)
        status, answer = self._request("POST", f"/v1/keys/{_quote(key)}/permits", body)
        if status != 201:
            raise self._refusal(status, answer, key, weight)
        path = f"/v1/keys/{_quote(key)}/permits/{_quote(answer['id'])}"
        return self._permit((key,), answer, answer.get("limit"), answer.get("in_flight", 0), path, body)

    def try_acquire_all(
        self, keys: Sequence[str], id: str | None = None, weight: int = 1, lease: float | None = None
    ) -> Permit:
        """``POST /v1/permits``: every key or none."""
        unique = _core.unique_keys(keys)
        body = self._terms(id, weight, lease)
        status, answer = self._request("POST", "/v1/permits", {"keys": list(unique), **body})
        if status != 201:
            raise self._refusal(status, answer, unique[0], weight)
        first = (answer.get("keys") or [{}])[0]
        path = f"/v1/permits/{_quote(answer['id'])}"
        return self._permit(unique, answer, first.get("limit"), first.get("in_flight", 0), path, body)

    def _terms(self, id: str | None, weight: int, lease: float | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "weight": _core.check_weight(weight),
            "lease_ms": self.lease_ms if lease is None else _core.to_lease_ms(lease),
        }
        if id is not None:
            body["id"] = _core.check_id(id)
        return body

    def _permit(
        self,
        keys: tuple[str, ...],
        answer: dict[str, Any],
        limit: int | None,
        in_flight: int,
        path: str,
        body: dict[str, Any],
    ) -> Permit:
        expires = answer.get("lease_expires_at_ms")
        id, weight = str(answer["id"]), int(answer.get("weight", body["weight"]))
        if expires is None:  # unlimited: nothing held
            return Permit(keys, id, weight, None, in_flight, None, None, None)
        token = int(answer.get("token") or 0)
        lease_ms = int(body["lease_ms"])
        held = Held(keys, id, weight, lease_ms, (), expires_at_ms=int(expires), token=token, extra=path)
        self._holders.add(held)
        self._renewer.add(held)
        return Permit(keys, id, weight, limit, in_flight, int(expires), held, self._renewer)

    def _renew_held(self, held: Held) -> bool:
        renewal = {"lease_ms": held.lease_ms, "token": self._holders.token(held)}
        status, answer = self._request("PUT", str(held.extra), renewal)
        if status == 200:
            held.expires_at_ms = int(answer.get("lease_expires_at_ms") or 0)
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
        path = f"/v1/keys/{_quote(key)}/permits/{_quote(id)}?token={_core.check_token(token)}"
        status, answer = self._request("DELETE", path)
        if status not in (200, 204):
            raise self._refusal(status, answer, key, 1)
        return True

    def status(self, key: str) -> _core.KeyStatus:
        """``GET /v1/keys/{key}`` (the HTTP API does not say the override: ``override`` is None)."""
        status, answer = self._request("GET", f"/v1/keys/{_quote(key)}")
        if status != 200:
            raise self._refusal(status, answer, key, 1)
        return _core.KeyStatus(key, answer.get("limit"), None, int(answer.get("in_flight", 0)))

    def set_limit(self, key: str, limit: int) -> _core.KeyStatus:
        """``PUT /v1/keys/{key}/limit``; 0 clears the override."""
        _core.change_arg(limit)
        status, answer = self._request("PUT", f"/v1/keys/{_quote(key)}/limit", {"limit": limit})
        if status != 200:
            raise self._refusal(status, answer, key, 1)
        return _core.KeyStatus(key, answer.get("limit"), limit or None, int(answer.get("in_flight", 0)))

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
