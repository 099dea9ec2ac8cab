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


def test_a_batch_of_releases_reads_entries_only_while_one_may_exist(r: redis.Redis) -> None:
    """``batch.lua`` (``common.lua``'s ``meta``) stops reading a busy key's entries in a call once it found
    the hash holding none; a lease with an entry (weight 2) is still released at its weight, and a release
    after two expired leases were reclaimed still calls the key's queue."""
    batch = r.register_script(_core.script_text("batch"))
    names = _keys.names("", "k")
    limits = [_core.ClassLimits(3, 0)]

    def call(offset: int, *records: list[_core.Arg]) -> list[int]:
        args: list[_core.Arg] = [offset]
        for record in records:
            args.extend(record[1:])
        return batch(keys=names, args=args)

    def admit(id: str, weight: int = 1, lease_ms: int = 30_000) -> list[_core.Arg]:
        return _core.acquire_args(["k"], id, weight, lease_ms, limits, generated=True)

    def release(id: str) -> list[_core.Arg]:
        return _core.release_args(["k"], id)

    ids = [str(uuid.uuid4()) for _ in range(4)]
    call(0, admit(ids[0]), admit(ids[1], weight=2))
    assert call(0, release(ids[0]), release(ids[1]), release(ids[2])) == [1, 1, 0]
    assert r.zcard(names[0]) == 0 and r.hget(names[1], "") == b"0" and r.hlen(names[1]) == 2  # '' and '#'
    # Two plain leases that expire at 30 s, one live to 50 s, and a waiter queued behind them (its ticket
    # lasting a minute): the release of the live one, whose call first reclaims the two, calls the waiter.
    call(0, admit(ids[0]), admit(ids[1]))
    call(20_000, admit(ids[2]))
    wait = _core.Wait("turns:test#0", 0, "", 60_000)
    refused = call(20_000, _core.acquire_args(["k"], ids[3], 1, 30_000, limits, True, wait))
    assert _core.Answer(*refused).decision == 4  # WAITS
    before = publishes(r)
    assert call(31_000, release(ids[2])) == [1]
    assert publishes(r) == before + 1, "the waiter's turn called"
