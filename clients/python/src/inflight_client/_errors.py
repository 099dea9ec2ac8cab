"""The errors of an admission."""

from __future__ import annotations


class InflightError(Exception):
    """Any error of inflight's client (a refusal, an invalid request, a store that failed)."""


class TooManyRequests(InflightError):
    """The key is at its limit now: ``limit`` and ``in_flight`` are the key's figures (``None`` when the
    HTTP API did not give them). ``key_class`` is the key's class as refusals name it (its rule's pattern,
    ``"app:*"``, or ``"default"``: :meth:`Policy.class_of`; the server's from the HTTP API; ``None`` when
    not known)."""

    def __init__(
        self, limit: int | None, in_flight: int | None, key: str = "", *, key_class: str | None = None
    ) -> None:
        self.limit = limit
        self.in_flight = in_flight
        self.key = key
        self.key_class = key_class
        super().__init__(f"too many requests on {key!r}: {in_flight} in flight of a limit of {limit}")


class TooManyWaiters(TooManyRequests):
    """A waiting acquire found the key's queue of waiters at its bound (10,000 tickets, or 1,000 flows
    waiting), shared by every process on the store: nothing was queued. The HTTP API's 429
    ``too_many_waiters``; a :class:`TooManyRequests`, so that a handler of the one answers the other too.
    ``limit`` and ``in_flight`` are the key's figures (``None`` from the HTTP API); ``key_class`` its class,
    as :class:`TooManyRequests`'s."""

    def __init__(
        self, limit: int | None, in_flight: int | None, key: str = "", *, key_class: str | None = None
    ) -> None:
        self.limit = limit
        self.in_flight = in_flight
        self.key = key
        self.key_class = key_class
        InflightError.__init__(self, f"too many waiters queue on {key!r} (at its bound); try again later")


class WeightExceedsLimit(InflightError):
    """The permit's weight is more than the key's whole limit: it could never be admitted. ``key_class``:
    the key's class, as :class:`TooManyRequests`'s (``None`` from the HTTP API, whose 400 names none)."""

    def __init__(
        self, limit: int | None, weight: int, key: str = "", *, key_class: str | None = None
    ) -> None:
        self.limit = limit
        self.weight = weight
        self.key = key
        self.key_class = key_class
        super().__init__(f"weight {weight} exceeds the limit {limit} of {key!r}")


class Revoked(InflightError):
    """A waiting acquire whose place in the key's queue an admin revoked (``inflight serve``'s
    ``DELETE /v1/keys/{key}/waiters/{ticket}``, the Rust library's ``Limiter::revoke_waiter``): it stops
    waiting at once, admitted to nothing. The HTTP API's 409 ``revoked``. Not a :class:`TooManyRequests`:
    the key may have room; asking again takes a new place."""

    def __init__(self, key: str = "") -> None:
        self.key = key
        super().__init__(f"an admin revoked this wait's place in the queue of {key!r}")


class StoreError(InflightError):
    """The store (Redis, or the HTTP server) failed: unreachable, timed out, or reported itself unavailable
    (an outage: retrying later may succeed). Never raised for an argument (those raise ``TypeError`` or
    ``ValueError`` before the store is asked)."""


class UnexpectedAnswer(InflightError):
    """The store answered something this client cannot read: not JSON, JSON without the fields the API
    documents or with values of the wrong type (HTTP), or a script's answer of the wrong shape (Redis).
    A mismatch of versions, or something other than inflight answering (a proxy's error page): not an
    outage, so not a :class:`StoreError`. ``status`` is the HTTP status (``None`` for Redis)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)
