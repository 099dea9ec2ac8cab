"""``lone.lua`` (the manifest's ``lone``: one admission or release on one key, in fewer steps) does what
``batch.lua`` does with the same record, or answers nothing and changes nothing, so that the call goes to
``batch.lua``. Random records go to two keys alike, one the way the clients send them (``lone`` first) and
one to ``batch`` alone; their answers and live leases must agree at every step."""

from __future__ import annotations

import random
import uuid

import pytest
import redis

from inflight_client import _core, _keys

QUEUED = "\xfeq".encode("latin-1")  # base.lua's QUEUED field: the key may have a queue


def live(r: redis.Redis, names: list[str], offset_ms: int) -> list[tuple[bytes, int, int, bool]]:
    """The key's live leases (deadline past now): member, weight, length and whether the lease records its
    token, as the scripts count them."""
    seconds, micros = r.time()
    now = seconds * 1000 + micros // 1000 + offset_ms
    out = []
    for member in r.zrangebyscore(names[0], f"({now}", "+inf"):
        entry = r.hget(names[1], member)
        fields = entry.split() if entry else [b"1", b"30000"]
        out.append((member, int(fields[0]), int(fields[1]), len(fields) == 3))
    return sorted(out)


def publishes(r: redis.Redis) -> int:
    """The PUBLISH commands Redis has run (scripts' included)."""
    return int(r.info("commandstats").get("cmdstat_publish", {}).get("calls", 0))


def comparable(reply: list[int]) -> tuple[int, ...]:
    """An answer without what the clock decides (deadline, tokens) or when expired leases were reclaimed
    (a lone release leaves other expired leases for the next call to reclaim and report)."""
    if len(reply) == 1:
        return tuple(reply)
    answer = _core.Answer(*reply)
    return (*answer[:4], answer.token > 0, answer.held_weight, answer.held_lease_ms, answer.counted)


@pytest.mark.parametrize("seed", range(16))
def test_lone_does_what_batch_does_or_nothing(r: redis.Redis, seed: int) -> None:
    rng = random.Random(seed)
    lone = r.register_script(_core.script_text("lone"))
    batch = r.register_script(_core.script_text("batch"))
    both = {"lone": _keys.names("lone:", f"k{seed}"), "batch": _keys.names("batch:", f"k{seed}")}
    ids = ["job-0", "job-1"]  # given ids, admitted again while they hold a lease
    tokens: dict[str, dict[str, list[int]]] = {"lone": {}, "batch": {}}  # every admission's, by id
    generated: list[str] = []
    offset, answered, passed = 0, 0, 0
    for _ in range(200):
        step = rng.random()
        if step < 0.04:  # past every lease: the next calls meet expired ones
            offset += 100_000
            continue
        if step < 0.08:  # an override, or none
            limit = rng.choice([None, 1, 2, 5])
            for names in both.values():
                if limit:
                    r.set(names[2], limit)
                else:
                    r.delete(names[2])
            continue
        if step < 0.12:  # a queue may be there (a field left behind): lone.lua leaves the call to batch.lua
            for names in both.values():
                r.hset(names[1], QUEUED, 1)
            continue
        waiter = step > 0.9 and rng.randrange(3)  # a ticket: it queues on a full key, nobody barges past it
        priority = rng.choice([0, 1])
        release = step < 0.5
        if release:
            id = rng.choice(ids + generated) if generated else rng.choice(ids)
            with_token = rng.random() < 0.5
            earlier = rng.random() < 0.5  # a late release, of an admission the id's later one took over
        elif rng.random() < 0.5:
            id, fresh = str(uuid.uuid4()), True
            if rng.random() < 0.2 and generated:  # a generated id's admission sent again
                id = rng.choice(generated)
            generated.append(id)
        else:
            id, fresh = rng.choice(ids), False
        weight, lease_ms = rng.choice([1, 1, 1, 2]), rng.choice([30000, 30000, 60000])
        limits = [_core.ClassLimits(rng.choice([0, 3, 4]), 0)]
        replies, turns = {}, {}
        for side, names in both.items():
            if release:
                got = tokens[side].get(id, [0])
                token = (got[0] if earlier else got[-1]) if with_token else 0
                args = _core.release_args(["k"], id, token)
            else:
                wait = _core.Wait(f"{side}#{waiter}", priority, "", 30000) if waiter else None
                args = _core.acquire_args(["k"], id, weight, lease_ms, limits, generated=fresh, wait=wait)
            args[0] = offset
            published = publishes(r)
            reply = lone(keys=names, args=args) if side == "lone" else []
            if side == "lone":
                answered, passed = answered + (reply != []), passed + (reply == [])
            if reply == []:
                reply = batch(keys=names, args=args)
            replies[side] = reply
            turns[side] = publishes(r) - published  # the waiters told it is their turn
            if not release and reply[0] == _core.ADMITTED:
                tokens[side].setdefault(id, []).append(_core.Answer(*reply).token)
        assert comparable(replies["lone"]) == comparable(replies["batch"]), (seed, step, id, replies)
        assert turns["lone"] == turns["batch"], (seed, step, id, turns)
        assert live(r, both["lone"], offset) == live(r, both["batch"], offset), (seed, step, id)
    # Both ways were taken: lone.lua answered most calls, and left some to batch.lua.
    assert answered > 10 and passed > 0, (answered, passed)
