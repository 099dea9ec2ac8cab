"""A holder of the chaos runs (``inflight-chaos run``): Python's ``RedisLimiter`` acquiring, holding a random
short while and releasing from several threads, every operation a JSON line of its history (the format of
``inflight check-history``). Takes the same flags as ``inflight-chaos holder``."""

from __future__ import annotations

import argparse
import json
import os
import random
import threading
import time
from typing import Any

import redis
from redis.sentinel import Sentinel

from inflight_client import Permit, RedisLimiter, StoreError, TooManyRequests


class History:
    """One process's history: one ``write`` a line, timed on the wall clock read once and advanced by the
    monotonic clock."""

    def __init__(self, path: str, process: str) -> None:
        self.process = process
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()
        # The wall clock read between two close readings of the monotonic clock: a preemption between
        # the two clocks would shift this whole history by the pause (ms on a loaded machine).
        best: tuple[int, int, int] | None = None
        for _ in range(100):
            before = time.monotonic_ns()
            wall = time.time_ns()
            after = time.monotonic_ns()
            if best is None or after - before < best[0]:
                best = (after - before, wall, (before + after) // 2)
            if after - before < 20_000:
                break
        assert best is not None
        _, self._epoch_ns, self._start_ns = best

    def now(self) -> int:
        return self._epoch_ns + time.monotonic_ns() - self._start_ns

    def write(self, op: str, invoke_ns: int, complete_ns: int, fields: dict[str, Any]) -> None:
        line = {"process": self.process, "op": op, "invoke_ns": invoke_ns, "complete_ns": complete_ns}
        line.update(fields)
        data = (json.dumps(line) + "\n").encode()
        with self._lock:
            os.write(self._fd, data)


def limit_of(key: str) -> int:
    """The limit in a run's key name: ``l4:a`` has 4."""
    head = key.split(":", 1)[0]
    return int(head[1:]) if head.startswith("l") and head[1:].isdigit() else 0


def mix(name: str) -> list[tuple[list[str], int]]:
    """The permits a run's holders take (the same as the Rust holders')."""
    jobs = [(["l1:a"], 1), (["l4:a"], 1), (["l4:a"], 3), (["l64:a"], 1), (["l64:a"], 3)]
    if name == "multi":
        jobs += [(["l4:a", "l1:b"], 1), (["l64:a", "l4:b"], 3)]
    return jobs


def token_of(permit: Permit) -> int | None:
    """The permit's fencing token (``None`` for 0: nothing held, an unlimited key)."""
    return permit.token or None


def connect(url: str) -> redis.Redis[bytes]:
    """A client of ``redis://host:port`` or of the primary ``redis+sentinel://host:port,.../name`` names,
    with 1 s timeouts (a paused Redis is an error, not a hang)."""
    timeouts: dict[str, Any] = {"socket_timeout": 1.0, "socket_connect_timeout": 0.5}
    if url.startswith("redis+sentinel://"):
        hosts, name = url.removeprefix("redis+sentinel://").split("/", 1)
        nodes = [(host, int(port)) for host, port in (h.rsplit(":", 1) for h in hosts.split(","))]
        return Sentinel(nodes, **timeouts).master_for(name, **timeouts)
    return redis.Redis.from_url(url, **timeouts)


class Holder:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.history = History(args.out, args.process)
        self.until = time.monotonic() + args.duration_ms / 1000
        client = connect(args.target)
        rules = [{"keys": f"l{n}:*", "default": n} for n in (1, 4, 64)]
        self.limiter = RedisLimiter(client, limits=rules, lease=args.lease_ms / 1000)
        self._next = 0
        self._lock = threading.Lock()

    def next_id(self) -> str:
        with self._lock:
            self._next += 1
            return f"{self.args.process}-{self._next}"

    def op(self, op: str, keys: list[str], id: str, weight: int, times: tuple[int, int], **more: Any) -> None:
        fields = {
            "keys": keys,
            "id": id,
            "weight": weight,
            "lease_ms": self.args.lease_ms,
            "limits": [limit_of(k) for k in keys],
            "token": None,
        }
        fields.update(more)
        self.history.write(op, times[0], times[1], fields)

    def task(self, n: int) -> None:
        rng = random.Random(self.args.seed * 7919 + n)
        jobs = mix(self.args.mix)
        while time.monotonic() < self.until:
            j = rng.randrange(len(jobs))
            # Half the time the id this task used last for this job (a request retried under its id).
            id = f"{self.args.process}-t{n}-j{j}" if rng.random() < 0.5 else self.next_id()
            self.cycle(rng, id, *jobs[j])

    def cycle(self, rng: random.Random, id: str, keys: list[str], weight: int) -> None:
        invoke = self.history.now()
        try:
            permit = self.limiter.try_acquire_all(keys, id=id, weight=weight)
        except TooManyRequests:
            self.op("acquire", keys, id, weight, (invoke, self.history.now()), result="full")
            time.sleep(0.005 + rng.random() * 0.02)
            return
        except (StoreError, redis.RedisError, OSError):
            self.op("acquire", keys, id, weight, (invoke, self.history.now()), result="error")
            time.sleep(0.005 + rng.random() * 0.02)
            return
        result = "admitted" if permit.limit is not None else "unlimited"
        complete = self.history.now()
        self.op("acquire", keys, id, weight, (invoke, complete), result=result, token=token_of(permit))
        hold_until = time.monotonic() + self.hold(rng)
        lost, expires_ms, token = False, permit.expires_at_ms or 0, token_of(permit)
        while time.monotonic() < hold_until:
            time.sleep(0.01)
            if not lost and permit.lost:
                lost = True
                now = self.history.now()
                self.op("renew", keys, id, weight, (now, now), result="lost", token=token)
            if not lost and (permit.expires_at_ms or 0) > expires_ms:
                expires_ms = permit.expires_at_ms or 0
                # A lease re-added (it had gone) comes with a new token.
                readded = token_of(permit) != token
                token = token_of(permit)
                self.log_renewal(keys, id, weight, expires_ms, invoke, token, readded)
        invoke = self.history.now()
        # The client's release never raises (a failed one leaves a lease that ends on its own): "released"
        # says it was sent, which is all the checker reads from it (held until its invoke).
        result = "released" if permit.release() else "gone"
        self.op("release", keys, id, weight, (invoke, self.history.now()), result=result, token=token)

    def hold(self, rng: random.Random) -> float:
        """A random hold in seconds; one in eight longer than the lease (1 to 2.5 leases)."""
        lease: float = self.args.lease_ms / 1000
        longest: float = self.args.max_hold_ms / 1000
        if rng.randrange(8) == 0:
            return lease * (1 + rng.random() * 1.5)
        return 0.005 + rng.random() * longest

    def log_renewal(
        self,
        keys: list[str],
        id: str,
        weight: int,
        expires_ms: int,
        after_ns: int,
        token: int | None,
        readded: bool,
    ) -> None:
        """A renewal the client made, seen as a later expiry: Redis granted it at ``expires_ms - lease``
        (this machine's clock), so it was invoked before that (5 ms before, for the clocks' rounding) and
        after the admission's invoke (``after_ns``). ``readded``: the lease had gone and came back with a
        new ``token``."""
        now = self.history.now()
        granted = (expires_ms - self.args.lease_ms) * 1_000_000
        invoke = min(max(granted - 5_000_000, after_ns + 1), now)
        result = "readded" if readded else "renewed"
        self.op("renew", keys, id, weight, (invoke, now), result=result, token=token)

    def run(self) -> None:
        threads = [threading.Thread(target=self.task, args=(n,), daemon=True) for n in range(self.args.tasks)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.limiter.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kind", default="py")
    parser.add_argument("--target", required=True, help="the Redis URL")
    parser.add_argument("--upstream", default="")
    parser.add_argument("--process", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--duration-ms", type=int, default=10_000)
    parser.add_argument("--lease-ms", type=int, default=2_000)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--max-hold-ms", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mix", default="multi")
    parser.add_argument("--storm", action="store_true")
    Holder(parser.parse_args()).run()


if __name__ == "__main__":
    main()
