"""inflight_client.litellm in LiteLLM's real proxy, measured: two replicas on one redis-server (a fresh one on
a free 127.0.0.1 port, stopped at the end), the fake upstream and the keys of clients/python/tests
(litellm_support/gateway.py).

    target/litellm-venv/bin/python scripts/bench/litellm.py [TRIALS]   # default 20

(the venv scripts/test.sh makes, with this tree's client installed in it: `target/litellm-venv/bin/pip
install ./clients/python`). Prints two tables:

- the wake-up of a waiter across replicas: a stream on replica A holds the only slot of a key (limit 1), a
  request on replica B waits for it; the time from the upstream letting A's stream end to B's request
  reaching the upstream (A's stream ending in LiteLLM, the release, B's turn, B forwarding its request),
  TRIALS times, the two replicas taking turns;
- what a request costs Redis: 200 non-streamed requests one after another through one replica, admitted
  on four scopes (key, team, user, gateway), then released; Redis's own CPU time (INFO cpu: its idle
  work between requests too) and, of it, the time in the scripts and their calls (INFO commandstats) per
  request.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients" / "python" / "tests"))

import redis
from litellm_support.gateway import Call, open_gateway, poll, scope_key


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_us(r: redis.Redis) -> float:
    info = r.info("cpu")
    return (float(info["used_cpu_user"]) + float(info["used_cpu_sys"])) * 1e6


def scripts(r: redis.Redis) -> tuple[int, int]:
    """Script calls Redis has run, and the µs it spent in them (INFO commandstats)."""
    stats = r.info("commandstats")
    found = [stats.get(f"cmdstat_{c}", {}) for c in ("evalsha", "eval")]
    calls = sum(int(s.get("calls", 0)) for s in found)
    return calls, sum(int(s.get("usec", 0)) for s in found)


def main() -> None:
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    port = free_port()
    work = Path(tempfile.mkdtemp())
    server = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}"
    r = redis.Redis.from_url(url)
    poll(lambda: _pings(r), "redis-server up", 30)
    g = open_gateway(url, work)
    try:
        up, key = g.upstream, scope_key("key", "sk-wait")
        for proxy in (g.a, g.b):  # warm: each replica's first request, stream and ticket
            Call(proxy, "sk-e1").finished()
            first = g.stream(proxy, "sk-wait")
            waiter = Call(proxy, "sk-wait", mode="plain", stream=True)
            g.wait_queued(key, 1)
            up.finish(first.tag)
            first.finished()
            waiter.finished()
            poll(lambda: g.leases(key) == 0, "the warm-up's leases released")
        woke = []
        for i in range(trials):
            holder, waiter_side = (g.a, g.b) if i % 2 == 0 else (g.b, g.a)
            first = g.stream(holder, "sk-wait")
            waiter = Call(waiter_side, "sk-wait", mode="hold", stream=True)
            g.wait_queued(key, 1)
            let_go = time.monotonic()
            up.finish(first.tag)
            up.wait_started(waiter.tag)
            woke.append((up.started_at[waiter.tag] - let_go) * 1000)
            first.finished()
            up.finish(waiter.tag)
            waiter.finished()
            poll(lambda: g.leases(key) == 0, "the waiter's lease released")
        # The floor: a request sent to the other replica as the stream is let go, on a key with room.
        sent = []
        for i in range(trials):
            holder, other = (g.a, g.b) if i % 2 == 0 else (g.b, g.a)
            first = g.stream(holder, "sk-e2")
            let_go = time.monotonic()
            up.finish(first.tag)
            fresh = Call(other, "sk-e2")
            up.wait_started(fresh.tag)
            sent.append((up.started_at[fresh.tag] - let_go) * 1000)
            first.finished()
            fresh.finished()
        print("| from letting a stream on one replica end, ms | p50 | p90 | max | trials |")
        print("|---|---|---|---|---|")
        for label, times in (
            (
                "to the request waiting for its slot on the other replica reaching the upstream",
                woke,
            ),
            (
                "to a request sent then to the other replica, on a key with room, reaching it",
                sent,
            ),
        ):
            times.sort()
            p90 = times[min(len(times) - 1, int(len(times) * 0.9))]
            print(f"| {label} | {statistics.median(times):.1f} | {p90:.1f} | {times[-1]:.1f} | {trials} |")

        n = 200
        for _ in range(5):  # warm: scripts loaded, connections made
            Call(g.a, "sk-e1").finished()
        cpu, (calls, usec), started = cpu_us(r), scripts(r), time.monotonic()
        for _ in range(n):
            call = Call(g.a, "sk-e1")
            assert call.wait_answered() == 200, call.text
            call.finished()
        seconds = time.monotonic() - started
        after = scripts(r)
        cpu, calls, usec = cpu_us(r) - cpu, after[0] - calls, after[1] - usec
        print()
        print(
            "| a request through one replica, four scopes | requests/s | Redis CPU per request, µs "
            "| of which in its scripts, µs | script calls per request |"
        )
        print("|---|---|---|---|---|")
        print(
            f"| 200 non-streamed, one after another | {n / seconds:.0f} | {cpu / n:.0f} | {usec / n:.0f} "
            f"| {calls / n:.2f} |"
        )
    finally:
        g.close()
        server.terminate()
        server.wait(30)


def _pings(r: redis.Redis) -> bool:
    try:
        return bool(r.ping())
    except redis.ConnectionError:
        return False


if __name__ == "__main__":
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    main()
