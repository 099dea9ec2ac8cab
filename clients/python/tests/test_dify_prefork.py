"""The drop-in configured in a parent, then forked into workers (Celery's prefork pool, gunicorn ``--preload``
with sync workers): each child admits, renews and releases its own slots, and the parent keeps its own.

An independent probe: each child logs the monotonic time (the same clock in every process) just after its
``enter`` returned and just before it calls ``exit``, so that each logged span lies inside a held slot;
the most spans that overlap, plus the parent's slot, never pass the limit."""

from __future__ import annotations

import os
import signal
import time
import traceback
from pathlib import Path

import redis

from inflight_client import dify

LIMIT = 2
LEASE = 0.6
# Per child, how long each of its holds lasts: every child holds once past the lease (renewed), the first
# past three leases (> 2 s); the rest are short, to contend for the slot.
HOLDS = [
    [2.2, 0.05, 0.05, 0.05],
    [1.0, 0.05, 0.05, 0.05],
    [1.0, 0.05, 0.05, 0.05],
]
DEADLINE = 15.0  # seconds each child has for all its holds (they need about 5 between them)


def child(log_path: Path, holds: list[float]) -> None:
    limit = dify.RateLimit("app-1", LIMIT)
    deadline = time.monotonic() + DEADLINE
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    try:
        for hold in holds:
            while True:
                try:
                    request_id = limit.enter()
                    break
                except dify.AppInvokeQuotaExceededError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.005)
            os.write(fd, f"{os.getpid()} enter {time.monotonic_ns()} {hold}\n".encode())
            time.sleep(hold)
            # Still counted at the end of the hold (the parent's slot and this one): never lapsed.
            in_flight = dify._configured().limiter.status("app:app-1").in_flight
            os.write(fd, f"{os.getpid()} exit {time.monotonic_ns()} {in_flight}\n".encode())
            limit.exit(request_id)
    finally:
        os.close(fd)


def max_overlap(lines: list[str]) -> tuple[int, list[tuple[int, float, int]]]:
    """The most spans open at once (an exit at the same instant as an enter counts first); the spans (pid,
    seconds, in flight seen at their end)."""
    events: list[tuple[int, int]] = []
    opened: dict[str, int] = {}
    spans: list[tuple[int, float, int]] = []
    for line in lines:
        pid, what, at, last = line.split()
        if what == "enter":
            opened[pid] = int(at)
            events.append((int(at), 1))
        else:
            spans.append((int(pid), (int(at) - opened.pop(pid)) / 1e9, int(last)))
            events.append((int(at), -1))
    assert not opened, opened
    most = current = 0
    for _, step in sorted(events):
        current += step
        most = max(most, current)
    return most, spans


def test_children_forked_after_configure_share_the_limit_renew_and_release(
    r: redis.Redis, tmp_path: Path
) -> None:
    limiter = dify.configure(r, lease=LEASE)
    log_path = tmp_path / "spans.log"
    log_path.touch()
    pids: list[int] = []
    try:
        # The parent holds one slot (its renewer thread running) across the forks and the children's work.
        limit = dify.RateLimit("app-1", LIMIT)
        parent_id = limit.enter()
        for holds in HOLDS:
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    child(log_path, holds)
                except BaseException:
                    traceback.print_exc()
                    code = 1
                finally:
                    os._exit(code)
            pids.append(pid)
        codes: dict[int, int] = {}
        for pid in pids:
            _, status = os.waitpid(pid, 0)
            codes[pid] = os.waitstatus_to_exitcode(status)
        pids.clear()
        assert set(codes.values()) == {0}, codes

        lines = log_path.read_text().splitlines()
        most, spans = max_overlap(lines)
        assert most + 1 <= LIMIT, lines  # + the parent's slot
        assert len(spans) == sum(len(h) for h in HOLDS)
        assert len({pid for pid, _, _ in spans}) == len(HOLDS)
        # Every slot still counted at its end, the longest held past three leases: renewed in each child.
        assert [last for _, _, last in spans] == [LIMIT] * len(spans), lines
        assert sum(seconds > LEASE for _, seconds, _ in spans) == len(HOLDS)
        assert max(seconds for _, seconds, _ in spans) > 2.0
        # Every child's slot given back; the parent's, held all along (> 5 s, leases of 0.6 s), still held.
        assert limiter.status("app:app-1").in_flight == 1
        limit.exit(parent_id)
        assert limiter.status("app:app-1").in_flight == 0
    finally:
        for pid in pids:  # a child left running by a failed assertion above
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        limiter.close()
