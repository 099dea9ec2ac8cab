"""``RedisLimiter``: inflight's own Lua scripts run from Python on the same Redis as the Rust processes."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, TypeVar

import redis
from redis.cluster import NodesManager, RedisCluster

from . import _core, _dify_layout, _input
from ._errors import Revoked, StoreError, TooManyRequests
from ._permit import GuardedStream, Held, Holders, Permit, Renewer, log
from ._policy import ClassLimits, Policy, RuleLike
from ._turns import RECHECK, TICKET_LEASE_MS, Turns, handed

T = TypeVar("T")


def is_cluster(redis_client: object) -> bool:
    """A Redis Cluster client: redis-py's ``RedisCluster``, or a wrapper that hands its attributes on to one
    (Dify's ``RedisClientWrapper`` under ``REDIS_USE_CLUSTERS``)."""
    if isinstance(redis_client, RedisCluster):
        return True
    try:
        return isinstance(getattr(redis_client, "nodes_manager", None), NodesManager)
    except Exception:
        return False


class RedisLimiter:
    """Per-key in-flight limits in Redis, shared with every inflight process (Rust or Python) that uses the
    same Redis and prefix: the same scripts, key names, ids, classes and overrides.

    ``default_limit`` and ``max_limit`` are the limits of keys that match no rule of ``limits`` (each rule
    ``{"keys": "tenant:*", "default": 50, "max": 200}`` or a :class:`Rule`); 0 is unlimited / no ceiling.
    ``lease`` is the default lease in seconds. Thread-safe, and safe under gevent (redis-py and
    ``threading`` only); one background thread renews every permit this limiter hands out.

    ``layout="dify"`` keeps Dify's own keys (as ``inflight --layout dify`` does): a key is an app id, its
    count is the length of ``dify:rate_limit:{app}:active_requests``, which unmodified Dify workers share,
    and ``dify:rate_limit:{app}:max_active_requests`` is its override; weights must be 1, and Dify's
    entries older than ``dify_stale_after`` seconds give way when they stand in the way. An entry's start
    time is its lease's end less ``dify_stale_after`` (dify.lua), so that no live entry is ever old enough
    for Dify's workers to evict, whatever the lease. ``dify_key_prefix`` is Dify's ``REDIS_KEY_PREFIX``,
    put before both names as Dify's client puts it (``<prefix>:dify:rate_limit:...``). A key whose limit
    Dify has not written (a cold app) takes its class's default, capped by the ceiling: the layout needs a
    default or a ceiling above 0 (``ValueError`` otherwise), or cold apps would be admitted without limit.
    """

    def __init__(
        self,
        redis_client: redis.Redis | RedisCluster,
        default_limit: int = 0,
        max_limit: int = 0,
        limits: Iterable[RuleLike] = (),
        lease: float = 30.0,
        prefix: str = "inflight:",
        layout: str = "inflight",
        dify_stale_after: float = _dify_layout.STALE_AFTER,
        dify_key_prefix: str = "",
        *,
        _limits_per_call: bool = False,
    ) -> None:
        if layout not in ("inflight", "dify"):
            raise ValueError(f"layout must be 'inflight' or 'dify', not {layout!r}")
        self.cluster = is_cluster(redis_client)
        if self.cluster and layout == "dify":
            # As `inflight --layout dify` refuses a cluster: one admission reads the app's hash and its limit
            # key, which Dify names without a shared hash tag, so they are in different slots.
            raise ValueError(
                "the Dify layout cannot run on Redis Cluster: Dify's keys of an app (its hash and its limit "
                "key) are in different slots, which one atomic script cannot read; use layout='inflight'"
            )
        self.policy = Policy(default_limit, max_limit, limits)
        if layout == "dify" and not _limits_per_call and self.policy.default.unlimited:
            raise ValueError(
                "the Dify layout needs a default_limit or a max_limit above 0 (Dify's "
                "APP_DEFAULT_ACTIVE_REQUESTS, APP_MAX_ACTIVE_REQUESTS): it is the limit of an app whose "
                "limit Dify has not written to Redis, which would otherwise be admitted without limit"
            )
        self.prefix = prefix
        self.layout = layout
        self._stale_ms = _core.to_age_ms(dify_stale_after) if layout == "dify" else 0
        self.dify_key_prefix = _dify_layout.normalize_key_prefix(dify_key_prefix)
        self.lease_ms = _core.to_lease_ms(lease)
        self._redis = redis_client
        self._batch = redis_client.register_script(_core.script_text("batch"))
        self._lone = redis_client.register_script(_core.script_text("lone"))
        self._passed = _core.Passed()
        self._renew = redis_client.register_script(_core.script_text("renew"))
        self._status = redis_client.register_script(_core.script_text("status"))
        self._dify = redis_client.register_script(_core.script_text("dify"))
        self._index = redis_client.register_script(_core.script_text("index"))
        self._holders = Holders()
        self._renewer = Renewer(self._renew_held, self._release_held, siblings=self._holders.siblings)
        self._turns = Turns(redis_client, prefix)

    def _records(self, keys: list[str], args: list[_core.Arg]) -> Any:
        """``batch.lua``'s answer to one record; ``lone.lua``'s where it takes it (``_core.lone``)."""
        if _core.lone(args) and self._passed.may_take(keys[0]):
            reply = self._call(self._lone, keys, args)
            if reply != []:
                return reply
            self._passed.note(keys[0])
        return self._call(self._batch, keys, args)

    def _call(self, script: Any, keys: list[str], args: list[_core.Arg]) -> Any:
        try:
            return script(keys=keys, args=args)
        except (redis.RedisError, redis.exceptions.RedisClusterException) as error:
            raise StoreError(str(error)) from error

    def try_acquire(
        self,
        key: str,
        id: str | None = None,
        weight: int = 1,
        lease: float | None = None,
        *,
        holder: str | None = None,
    ) -> Permit:
        """A permit on ``key`` now, or :class:`TooManyRequests` when it is at its limit. An ``id`` the key
        already holds counts once (and refreshes its lease). ``holder``: a label (1 to 128 bytes, no
        control characters; a client's address, a worker's name), listed with the permit's lease by
        ``inflight serve``'s ``GET /v1/keys/{key}/permits`` so that an operator can tell holders apart;
        shown to whoever may list holders, so never a secret. Not kept under the Dify layout."""
        return self.try_acquire_all([key], id=id, weight=weight, lease=lease, holder=holder)

    def try_acquire_all(
        self,
        keys: Sequence[str],
        id: str | None = None,
        weight: int = 1,
        lease: float | None = None,
        *,
        holder: str | None = None,
    ) -> Permit:
        """A permit on every key at once (one atomic script call), or on none: the refusal names the key
        that refused. Repeated keys count once; at most 16 keys."""
        unique = _core.unique_keys(keys)
        limits = [self.policy.limits(k) for k in unique]
        return self._acquire(unique, id, weight, lease, limits, holder=_input.holder(holder))

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
        """A permit on ``key``, waiting up to ``max_wait`` seconds (at most 300) for a slot in the key's
        queue of waiters, which every process on the store shares (Rust or Python): admitted in turn by
        ``priority`` (0 to 255, higher first), then by ``flow`` (the flows of a priority are served in
        turn), then by arrival. On timeout the refusal :meth:`try_acquire` gives (:class:`TooManyRequests`);
        :class:`TooManyWaiters` when the queue is at its bound; :class:`Revoked` when an admin revokes the
        waiter's place (``DELETE /v1/keys/{key}/waiters/{ticket}``). Waiting holds no slot, and a wait
        that ends unadmitted (a timeout, an error, ``KeyboardInterrupt``, a gevent ``Timeout``, the
        greenlet killed) leaves the queue. ``max_wait=0``: as :meth:`try_acquire`. ``holder``: as
        :meth:`try_acquire`'s, listed with the waiter's ticket too."""
        return self.acquire_all([key], max_wait, id, weight, lease, priority, flow, holder=holder)

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
        """:meth:`try_acquire_all`, waiting as :meth:`acquire` does: the waiter queues on the key that
        refuses it, and asks for every key again at its turn."""
        unique = _core.unique_keys(keys)
        wait_ms = _input.max_wait_ms(max_wait)
        priority, flow = _input.priority(priority), _input.flow(flow)
        holder = _input.holder(holder)
        limits = [self.policy.limits(k) for k in unique]
        if wait_ms == 0:
            return self._acquire(unique, id, weight, lease, limits, holder=holder)
        # Refused before a ticket is taken.
        if id is not None:
            _input.id(id)
        _core.check_weight(weight)
        if lease is not None:
            _core.to_lease_ms(lease)
        if self._renewer.closed:
            raise RuntimeError("the limiter is closed")
        deadline = time.monotonic() + wait_ms / 1000
        ticket = self._turns.take()
        wait_id, wait = _core.waiting(unique, id, ticket.name, priority, flow, TICKET_LEASE_MS)
        admitted = interrupted = False
        queued_on: _core.Queued | None = None  # its last refusal: the key whose queue it waits in
        try:
            # (Subscribed already: no turn of the ticket can go unheard, and its first refusal is the wait's.)
            heard, fresh = self._turns.is_heard(), wait.handoff
            while True:
                ticket.called.clear()  # a turn called from now on is kept until the wait below
                ticket.handed = None  # (a slot handed before this ask is the ask's: its id holds it)
                try:
                    permit = self._acquire(unique, wait_id, weight, lease, limits, wait, holder, fresh)
                except _core.Queued as queued:
                    refused = queued_on = queued
                else:
                    # (Admitted, the script took the ticket out; unlimited, it is given up below.)
                    admitted = permit.expires_at_ms is not None
                    if queued_on is not None:
                        permit.queued_on, permit.queued_class = queued_on.key, queued_on.key_class
                    return permit
                fresh = False
                if ticket.revoked:  # (its ask, after the revocation, took no place)
                    raise Revoked(refused.key)
                if ticket.handed is not None:  # handed while the ask was on its way: asked again at once
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TooManyRequests(
                        refused.limit, refused.in_flight, refused.key, key_class=refused.key_class
                    ) from None
                if not heard:
                    # A turn called before the subscription was in force went unheard: asked again after.
                    heard = True
                    self._turns.heard(min(RECHECK, left))
                    continue
                # Its turn, the slot handed to it, its revocation, or a re-check (which renews the ticket).
                ticket.called.wait(min(RECHECK, left))
                if ticket.revoked:
                    raise Revoked(refused.key)
                if ticket.handed is not None and wait_id is not None:  # held, without asking again
                    lease_ms = self.lease_ms if lease is None else _core.to_lease_ms(lease)
                    permit = self._hold(*handed(unique, wait_id, weight, lease_ms, limits, ticket.handed))
                    admitted = True
                    permit.queued_on, permit.queued_class = refused.key, refused.key_class
                    return permit
        except BaseException as error:
            interrupted = not isinstance(error, Exception)
            raise
        finally:
            self._turns.drop(ticket)
            if not admitted and not ticket.revoked:  # (a revoked ticket was given up by the revocation)
                self._give_up(unique, ticket.name, wait_id if wait.handoff else None, interrupted)

    def _give_up(self, keys: tuple[str, ...], ticket: str, id: str | None, interrupted: bool) -> None:
        """The ticket leaves the queues of ``keys`` (with the wait's ``id``: a slot a release handed it
        goes back). A wait interrupted (``KeyboardInterrupt``, gevent's ``Timeout``, the greenlet killed)
        hands it to the renewal thread, as an interrupted release does; one that fails leaves a ticket that
        ends with its lease (and a handed slot, with the lease of its ticket)."""
        if interrupted:
            self._renewer.call_later(lambda: self._leave(keys, ticket, id))
            return
        try:
            self._leave(keys, ticket, id)
        except Exception:
            log.debug("inflight: giving up ticket %s failed; it ends with its lease", ticket, exc_info=True)
        except BaseException:
            self._renewer.call_later(lambda: self._leave(keys, ticket, id))
            raise

    def _leave(self, keys: tuple[str, ...], ticket: str, id: str | None = None) -> None:
        if self.layout == "dify":
            reply = self._call_dify("l", keys, ticket, 0, "", [])
            # No longer queued: a slot a release handed it goes back (as batch.lua's leave with flags 8).
            if _core.ints(reply, 1)[0] == 0 and id is not None:
                self.release(keys, id)
        else:
            names = _core.key_names(self.prefix, keys)
            reply = self._call(self._batch, names, _core.leave_args(keys, ticket, id))
        _core.ints(reply, 1)

    def _acquire(
        self,
        keys: tuple[str, ...],
        id: str | None,
        weight: int,
        lease: float | None,
        limits: Sequence[ClassLimits],
        wait: _core.Wait | None = None,
        holder: str | None = None,
        fresh: bool = False,
    ) -> Permit:
        if self._renewer.closed:
            raise RuntimeError("the limiter is closed")
        keys = _core.unique_keys(keys)
        generated = id is None or fresh  # (a wait's first ask under its own id: no lease can hold it)
        id = _core.check_id(id)
        weight = _core.check_weight(weight)
        lease_ms = self.lease_ms if lease is None else _core.to_lease_ms(lease)
        if self.layout == "dify" and weight != 1:
            raise ValueError("the Dify layout counts every permit as one: weights must be 1")
        held_before = self._holders.holds(keys, id)
        try:
            if self.layout == "dify":
                reply = self._call_dify("a", keys, id, lease_ms, "", limits, wait)
            else:
                reply = self._records(
                    _core.key_names(self.prefix, keys),
                    _core.acquire_args(keys, id, weight, lease_ms, limits, generated, wait, holder),
                )
        except BaseException as error:
            # Interrupted (KeyboardInterrupt, gevent's Timeout, the greenlet killed) or timed out waiting for
            # the answer: Redis may have admitted. Give the slot back unless another permit here holds the id.
            unanswered = not isinstance(error, Exception) or isinstance(error.__cause__, redis.TimeoutError)
            if unanswered and not held_before:
                self._give_back(keys, id, 0)
            raise
        limit, in_flight, expires_at_ms, token = _core.admission(reply, keys, weight, self.policy)
        if expires_at_ms is None:
            return Permit(keys, id, weight, None, 0, None, None, None)
        return self._hold(
            Held(keys, id, weight, lease_ms, tuple(limits), expires_at_ms=expires_at_ms, token=token),
            limit,
            in_flight,
        )

    def _hold(self, held: Held, limit: int | None, in_flight: int) -> Permit:
        """The permit of ``held``, which Redis recorded: renewed from now on."""
        keys, id = held.keys, held.id
        try:
            self._holders.add(held)
            self._renewer.add(held)
            return Permit(keys, id, held.weight, limit, in_flight, held.expires_at_ms, held, self._renewer)
        except BaseException:
            # Redis admitted: whatever failed here, the slot goes back before the error goes on.
            with contextlib.suppress(Exception):
                self._renewer.take(held)
            try:
                last, token = self._holders.count_out(held)
            except Exception:
                last, token = True, held.token
            if last:
                self._give_back(keys, id, token)
            raise

    def _give_back(self, keys: tuple[str, ...], id: str, token: int) -> None:
        """Releases an admission that no permit will hold; a failure leaves a lease that ends on its own."""
        try:
            self.release(keys, id, token)
        except Exception:
            log.warning("inflight: giving back the admission of %s failed", id, exc_info=True)

    def release(self, keys: str | Sequence[str], id: str, token: int = 0) -> bool:
        """Releases the permit ``id`` from ``keys`` (a key or its keys), wherever it was acquired (another
        process, Rust or Python), unless a later admission of the id took its lease over (a ``token``
        other than its own; 0: whichever lease the id holds); False when none held it."""
        unique = _core.unique_keys([keys] if isinstance(keys, str) else keys)
        if self.layout == "dify":
            return _core.ints(self._call_dify("r", unique, _input.id(id), 0, "", []), 1)[0] == 1
        args = _core.release_args(unique, _input.id(id), token)
        reply = self._records(_core.key_names(self.prefix, unique), args)
        return _core.ints(reply, 1)[0] == 1

    def _release_held(self, held: Held) -> None:
        last, token = self._holders.count_out(held)
        if last:
            self.release(held.keys, held.id, token)

    def _call_dify(
        self,
        op: str,
        keys: Sequence[str],
        id: str,
        lease_ms: int,
        extra: str,
        limits: Sequence[ClassLimits],
        wait: _core.Wait | None = None,
    ) -> Any:
        names = _dify_layout.key_names(keys, self.dify_key_prefix)
        return self._call(
            self._dify, names, _dify_layout.args(op, id, lease_ms, self._stale_ms, extra, limits, wait)
        )

    def _renew_held(self, held: Held) -> bool:
        if self.layout == "dify":
            reply = self._call_dify("n", held.keys, held.id, held.lease_ms, "1", held.limits)
        else:
            reply = self._call(
                self._renew,
                _core.key_names(self.prefix, held.keys),
                _core.renew_args(held.id, held.lease_ms, held.weight, held.limits, self._holders.token(held)),
            )
        # renew.lua answers two numbers more (whether a key of the call held it, the token); dify.lua five.
        answer = _core.ints(reply, 5) if self.layout == "dify" else _core.ints(reply, 7)[:5]
        outcome, _limit, _in_flight, _weight, expires_at_ms = answer
        if outcome in (1, 2):
            held.expires_at_ms = expires_at_ms
            return True
        return False

    def status(self, key: str) -> _core.KeyStatus:
        """The key's limit, override and in-flight count, read in one atomic step."""
        return self._status_with(key, "")

    def set_limit(self, key: str, limit: int) -> _core.KeyStatus:
        """Sets the key's own limit (an override, capped by its class's max); 0 clears it."""
        return self._status_with(key, _core.change_arg(limit))

    def clear_limit(self, key: str) -> _core.KeyStatus:
        """Clears the key's override."""
        return self._status_with(key, "0")

    def _status_with(self, key: str, change: str) -> _core.KeyStatus:
        key = _input.key(key)
        if self.layout == "dify":
            names = [*_dify_layout.key_names([key], self.dify_key_prefix), f"{self.prefix}overrides"]
            args = _dify_layout.args("s", "", 0, self._stale_ms, change, [self.policy.limits(key)])
            return _core.status(self._call(self._dify, names, [*args, 0, key]), key)
        if self.cluster:
            return self._status_cluster(key, change)
        keys, args = _core.status_call(self.prefix, key, self.policy.limits(key), change)
        return _core.status(self._call(self._status, keys, args), key, 4)

    def _status_in_slot(self, key: str, change: str) -> _core.KeyStatus:
        """``status.lua`` without the index of overrides (in a slot of its own on a cluster)."""
        keys, args = _core.status_call(self.prefix, key, self.policy.limits(key), change)
        return _core.status(self._call(self._status, keys[:3], args), key, 4)

    def _index_change(self, op: str, key: str, value: _core.Arg) -> None:
        """``index.lua``: the Rust processes' index of overrides on a cluster, ``<prefix>{overrides}``."""
        index = f"{self.prefix}{{overrides}}"
        args: list[_core.Arg] = [op, key, value, f"{self.prefix}overrides", 0]
        self._call(self._index, [index, f"{index}:version"], args)

    def _status_cluster(self, key: str, change: str) -> _core.KeyStatus:
        """As the Rust store's ``status_cluster``: the override in the key's slot, the index in its own, in
        the order that keeps the index a superset of the keys with an override."""
        if change == "":
            return self._status_in_slot(key, change)
        if change != "0":
            self._index_change("+", key, change)
            status = self._status_in_slot(key, change)
            self._index_change("+", key, change)  # a concurrent clear may have removed it meanwhile
            return status
        status = self._status_in_slot(key, change)
        self._index_change("-", key, 0)
        now = self._status_in_slot(key, "")
        if now.override is not None:  # a concurrent set after its own index step: add it back
            self._index_change("+", key, now.override)
        return status

    def guard_stream(self, permit: Permit, iterable: Iterable[T]) -> GuardedStream[T]:
        """Yields every item of ``iterable``; releases ``permit`` when it ends, raises or is closed."""
        return GuardedStream(permit, iterable)

    def close(self) -> None:
        """Stops the renewals (held permits then keep their slots until their leases end) and the
        subscription to turns."""
        self._turns.close()
        self._renewer.close()

    def __enter__(self) -> RedisLimiter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
