"""inflight_client.litellm in LiteLLM's real proxy: two ``litellm`` processes (replicas A and B) on one
redis-server, a fake OpenAI upstream that streams server-sent events (litellm_support/upstream.py), keys
and teams from LiteLLM's ``custom_auth`` (no database).

Measured, not assumed: the most requests the upstream served at once per key, team, user, end user and
model group (across both replicas) against each limit; each release path's log line (exactly one per
request) and the leases left in Redis; a waiter on one replica admitted when a stream on the other ends;
priorities and fair shares; a replica SIGKILLed mid-stream. Every wait is a poll with a generous deadline
that stops as soon as its condition holds; nothing asserts a duration.

LiteLLM is installed in a venv of its own (``target/litellm-venv``, made by scripts/test.sh); without it
these tests are skipped. ``INFLIGHT_LITELLM_BIN`` names another ``litellm`` executable.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import tempfile
import time
import types
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from conftest import free_port, redis_server
from litellm_support.gateway import (
    LEASE,
    LITELLM,
    Call,
    Gateway,
    Proxy,
    open_gateway,
    poll,
    scope_key,
)

from inflight_client._keys import names

if not LITELLM.is_file():
    pytest.skip(f"LiteLLM is not installed ({LITELLM}; scripts/test.sh makes it)", allow_module_level=True)


@pytest.fixture(scope="module")
def gateway(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    g = open_gateway(redis_url, tmp_path_factory.mktemp("litellm"))
    try:
        yield g
    finally:
        g.close()


def test_limits_hold_across_both_replicas(gateway: Gateway) -> None:
    g, up = gateway, gateway.upstream
    held: list[Call] = []
    refusals: list[tuple[str, dict[str, object]]] = []

    def send(
        proxy: Proxy, key: str, labels: dict[str, str], model: str = "m1", user: str | None = None
    ) -> None:
        call = Call(proxy, key, mode="hold", stream=True, model=model, labels=labels, user=user)
        if call.wait_answered() == 200:
            up.wait_started(call.tag)
            held.append(call)
        else:
            assert call.status == 429, call.text
            assert call.headers.get("retry-after") == "1"
            error = json.loads(call.finished())["error"]
            assert error["code"] == "429" and "too many requests in flight" in error["message"]
            refusals.append((key, error["provider_specific_fields"]))

    # A key of limit 2 (its metadata): 2 of 5 admitted, alternating replicas.
    for i in range(5):
        send([g.a, g.b][i % 2], "sk-k1", {"key": "k1"})
    # A team of limit 3 (its metadata), a key of LiteLLM's max_parallel_requests 2 in it.
    for proxy, key in [(g.a, "sk-k2"), (g.b, "sk-k3"), (g.a, "sk-k3"), (g.b, "sk-k3"), (g.a, "sk-k2")]:
        send(proxy, key, {"team": "t-two", "key": key})
    # A model group of limit 4 (the file) over two keys of 3.
    for i, key in enumerate(["sk-k4"] * 4 + ["sk-k5"] * 2):
        send([g.b, g.a][i % 2], key, {"model": "m-limit", "key": key}, model="m-limit")
    # A user (the file: 1) over two keys; an end user (the body's "user"; the file: 1) over two keys.
    send(g.a, "sk-u1", {"user": "u-lim"})
    send(g.b, "sk-u2", {"user": "u-lim"})
    send(g.a, "sk-e1", {"end_user": "eu-1"}, user="eu-1")
    send(g.b, "sk-e2", {"end_user": "eu-1"}, user="eu-1")

    scopes = [(key, fields["scope"]) for key, fields in refusals]
    assert scopes == [
        ("sk-k1", "key"),
        ("sk-k1", "key"),
        ("sk-k1", "key"),
        ("sk-k3", "team"),
        ("sk-k2", "team"),
        ("sk-k4", "key"),
        ("sk-k5", "model"),
        ("sk-u2", "user"),
        ("sk-e2", "end_user"),
    ], refusals
    assert g.leases(scope_key("key", "sk-k1")) == 2
    assert g.leases(scope_key("team", "t-two")) == 3
    assert g.leases(scope_key("model", "m-limit")) == 4
    # Every admission also holds the gateway's key (limit 60) in the same step.
    assert g.leases("litellm:global") == len(held)

    # Churn: 24 short requests of the key of limit 2 at once, on both replicas.
    for call in held:
        up.finish(call.tag)
        call.finished()
    churn = [Call([g.a, g.b][i % 2], "sk-k1", labels={"key": "k1"}) for i in range(24)]
    statuses = sorted(c.wait_answered() for c in churn)
    for c in churn:
        c.finished()
    assert set(statuses) <= {200, 429} and 200 in statuses

    print("peak in flight per scope, both replicas:", dict(up.peak))
    assert up.peak[("key", "k1")] == 2
    assert up.peak[("team", "t-two")] == 3
    assert up.peak[("model", "m-limit")] == 4
    assert up.peak[("user", "u-lim")] == 1 and up.peak[("end_user", "eu-1")] == 1
    for key in ("sk-k1", "sk-k2", "sk-k3", "sk-k4", "sk-k5"):
        poll(lambda key=key: g.leases(scope_key("key", key)) == 0, f"{key}'s leases released")  # type: ignore[misc]


def test_every_path_releases_exactly_once(gateway: Gateway) -> None:
    g, up = gateway, gateway.upstream
    key = scope_key("key", "sk-paths")
    expected: dict[str, str] = {}

    # A stream to its end.
    call = g.stream(g.a, "sk-paths")
    assert g.leases(key) == 1
    up.finish(call.tag)
    assert "[DONE]" in call.finished()
    expected[call.call_id] = "stream_end"

    # The client leaves mid-stream: released while the upstream still holds it.
    call = g.stream(g.b, "sk-paths")
    call.disconnect()
    poll(lambda: g.leases(key) == 0, "the lease of a stream whose client left")
    up.finish(call.tag)
    call.finished()
    expected[call.call_id] = "stream_closed"

    # The upstream cuts the stream mid-body.
    call = g.stream(g.a, "sk-paths", mode="cut")
    up.finish(call.tag)
    call.finished()
    expected[call.call_id] = "stream_error"

    # A non-stream: success, and an upstream failure.
    call = Call(g.b, "sk-paths")
    assert call.wait_answered() == 200
    call.finished()
    expected[call.call_id] = "success"
    call = Call(g.a, "sk-paths", mode="fail")
    assert call.wait_answered() >= 500, call.text
    call.finished()
    expected[call.call_id] = "failure"

    # A stream that fails before its first chunk.
    call = Call(g.b, "sk-paths", mode="fail", stream=True)
    assert call.wait_answered() >= 500, call.text
    call.finished()
    expected[call.call_id] = "failure"

    poll(lambda: g.leases(key) == 0, "every lease of the paths released")
    poll(lambda: all(g.releases(c) for c in expected), "every release logged")
    found = {c: g.releases(c) for c in expected}
    print("releases per request:", found)
    assert found == {c: [path] for c, path in expected.items()}

    # A refusal (our own 429) releases nothing: the failure hook it reaches finds no slot of its own.
    held = g.stream(g.a, "sk-k1")
    other = g.stream(g.b, "sk-k1")
    refused = Call(g.a, "sk-k1")
    assert refused.wait_answered() == 429
    refused.finished()
    for c in (held, other):
        up.finish(c.tag)
        c.finished()
    poll(lambda: len(g.releases(held.call_id)) == 1 and len(g.releases(other.call_id)) == 1, "both released")
    assert g.releases(refused.call_id) == []
    poll(lambda: g.leases(scope_key("key", "sk-k1")) == 0, "k1's leases released")


def test_a_waiter_is_admitted_when_a_stream_on_the_other_replica_ends(gateway: Gateway) -> None:
    g, up = gateway, gateway.upstream
    key = scope_key("key", "sk-wait")
    first = g.stream(g.a, "sk-wait")
    waiter = Call(g.b, "sk-wait", mode="hold", stream=True)
    poll(lambda: g.queued(key) == 1, "the waiter queued on the key")
    assert not waiter.answered.is_set() and waiter.tag not in up.started
    up.finish(first.tag)
    first.finished()
    assert waiter.wait_answered() == 200
    up.wait_started(waiter.tag)
    up.finish(waiter.tag)
    assert "[DONE]" in waiter.finished()
    poll(lambda: g.leases(key) == 0, "the waiter's lease released")


def _served_in_turn(g: Gateway, model: str, first: Call, waiters: list[Call]) -> list[str]:
    """Releases ``first``, then each request as it is admitted: the order the upstream saw them in. One
    slot: the request admitted holds it until it is finished here, so at most one is admitted and not yet
    finished (the next may be admitted as soon as the previous one's release, before it is looked for)."""
    up = g.upstream
    up.finish(first.tag)
    first.finished()
    served: list[Call] = []

    def started() -> list[Call]:
        return [w for w in waiters if w.tag in up.started and w not in served]

    for _ in waiters:
        try:
            poll(lambda: bool(started()), "the next waiter admitted")
        except AssertionError:
            print(
                "stalled:",
                [(w.tag, w.proxy.name, w.status) for w in waiters if w not in served],
                g.state(model),
            )
            raise
        admitted = started()
        assert len(admitted) == 1, "one slot: one waiter at a time"
        up.finish(admitted[0].tag)
        admitted[0].finished()
        served.append(admitted[0])
    return [w.tag for w in sorted(waiters, key=lambda w: up.started.index(w.tag))]


def test_priorities_then_fair_shares_across_teams(gateway: Gateway) -> None:
    g = gateway
    # The model group m-prio admits one at a time; the high-priority team's waiter goes first.
    model = scope_key("model", "m-prio")
    first = g.stream(g.a, "sk-low", model="m-prio")
    waiters = []
    for proxy, key in [(g.b, "sk-low"), (g.a, "sk-low"), (g.b, "sk-high")]:
        waiters.append(Call(proxy, key, mode="hold", stream=True, model="m-prio"))
        g.wait_queued(model, len(waiters))
    order = _served_in_turn(g, model, first, waiters)
    assert order == [waiters[2].tag, waiters[0].tag, waiters[1].tag], order

    # m-fair: team A queues three, then team B two; the flows (teams) take turns.
    model = scope_key("model", "m-fair")
    first = g.stream(g.b, "sk-fa", model="m-fair")
    waiters = []
    for proxy, key in [(g.a, "sk-fa"), (g.b, "sk-fa"), (g.a, "sk-fa"), (g.b, "sk-fb"), (g.a, "sk-fb")]:
        waiters.append(Call(proxy, key, mode="hold", stream=True, model="m-fair"))
        g.wait_queued(model, len(waiters))
    order = _served_in_turn(g, model, first, waiters)
    a1, a2, a3, b1, b2 = (w.tag for w in waiters)
    assert order == [a1, b1, a2, b2, a3], order


def test_a_long_stream_stays_counted(gateway: Gateway) -> None:
    g, up = gateway, gateway.upstream
    key = scope_key("key", "sk-long")
    call = g.stream(g.a, "sk-long")
    lease_key = names("inflight:", key)[0]
    ends = [g.redis.zrange(lease_key, 0, -1, withscores=True)[0][1]]

    def renewed() -> bool:
        score = g.redis.zrange(lease_key, 0, -1, withscores=True)
        if score and score[0][1] > ends[-1]:
            ends.append(score[0][1])
        return len(ends) > 4  # four renewals: more than a lease of its own has passed

    poll(renewed, "the stream's lease renewed four times")
    refused = Call(g.b, "sk-long")
    assert refused.wait_answered() == 429
    refused.finished()
    up.finish(call.tag)
    call.finished()
    poll(lambda: g.leases(key) == 0, "released at its end")


def test_a_killed_replica_gives_its_slots_back_within_a_lease(gateway: Gateway) -> None:
    g, up = gateway, gateway.upstream
    c = Proxy("c", g.config, g.env, g.logs)
    g.extra.append(c)
    c.wait_ready()
    call = g.stream(c, "sk-kill")
    refused = Call(g.a, "sk-kill")
    assert refused.wait_answered() == 429
    refused.finished()
    c.stop(signal.SIGKILL)
    killed = time.monotonic()
    tries = 0

    def admitted() -> bool:
        nonlocal tries
        tries += 1
        after = Call(g.a, "sk-kill")
        status = after.wait_answered()
        after.finished()
        assert status in (200, 429), after.text
        return status == 200

    poll(admitted, "the killed replica's slot back")
    back = time.monotonic() - killed
    print(f"a SIGKILLed replica's slot back after {back:.2f} s, {tries} tries (lease {LEASE} s)")
    up.finish(call.tag)


# In this process (LiteLLM's own classes, no proxy): what the gateway above cannot show.


def _auth(team: str = "t", **fields: object) -> object:
    base: dict[str, object] = {"token": "0" * 64, "team_id": team, "user_id": "u", "metadata": {}}
    return types.SimpleNamespace(**{"team_metadata": {}, "max_parallel_requests": None, **base, **fields})


def _data(model: str = "m1") -> dict[str, object]:
    return {"litellm_call_id": str(uuid.uuid4()), "model": model, "metadata": {}}


def test_a_subclass_keeps_every_hook_where_litellm_looks() -> None:
    pytest.importorskip("litellm")
    from litellm.integrations.custom_logger import CustomLogger

    from inflight_client.litellm import HOOKS, InflightHandler, Settings

    class Mine(InflightHandler):
        async def async_post_call_success_hook(
            self, data: dict, user_api_key_dict: object, response: object
        ) -> object:  # type: ignore[type-arg]
            return await super().async_post_call_success_hook(data, user_api_key_dict, response)

    for hook in HOOKS:
        assert hook in vars(Mine), hook  # LiteLLM's test: "async_pre_call_hook" in vars(cls)
        assert getattr(Mine, hook) is not getattr(CustomLogger, hook)
    assert isinstance(Mine(Settings()), CustomLogger)


def test_redis_errors_follow_the_configured_policy() -> None:
    pytest.importorskip("litellm")
    from fastapi import HTTPException

    from inflight_client.litellm import InflightHandler, Settings

    dead = f"redis://127.0.0.1:{free_port()}"

    async def run(policy: str) -> object:
        h = InflightHandler(Settings(limits={"team": 1}, redis_url=dead, on_redis_error=policy))
        try:
            return await h.async_pre_call_hook(_auth(), None, _data(), "acompletion")
        finally:
            await h.close()

    assert isinstance(asyncio.run(run("allow")), dict)  # admitted without a limit
    with pytest.raises(HTTPException) as refused:
        asyncio.run(run("deny"))
    assert refused.value.status_code == 503


def test_every_scope_in_one_step_on_a_redis_cluster(redis_cluster: list[int]) -> None:
    pytest.importorskip("litellm")
    from fastapi import HTTPException

    from inflight_client.litellm import InflightHandler, Settings

    url = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in redis_cluster)
    limits = {"key": 5, "team": 2, "user": 5, "end_user": 5, "model": 5, "global": 5}

    async def run() -> None:
        h = InflightHandler(Settings(limits=limits, redis_url=url))
        try:
            first, second, third = _data(), _data(), _data()
            for data in (first, second):
                await h.async_pre_call_hook(_auth(), None, data, "acompletion")
            with pytest.raises(HTTPException) as refused:
                await h.async_pre_call_hook(_auth(), None, third, "acompletion")
            assert refused.value.status_code == 429 and refused.value.detail["scope"] == "team"
            assert await h.release(first, "success") and not await h.release(first, "success")
            await h.async_pre_call_hook(_auth(), None, third, "acompletion")
            for data in (second, third):
                assert await h.release(data, "success")
        finally:
            await h.close()

    asyncio.run(run())


def _admits_and_refuses(settings: object, check: redis.Redis) -> None:
    """A handler of ``settings`` (a team limit of 1) admits one request, refuses the next, records the lease
    where ``check`` reads, and releases it."""
    from fastapi import HTTPException

    from inflight_client.litellm import InflightHandler

    async def run() -> None:
        h = InflightHandler(settings)  # type: ignore[arg-type]
        try:
            first, second = _data(), _data()
            await h.async_pre_call_hook(_auth(), None, first, "acompletion")
            assert check.zcard(names("inflight:", "litellm:team:t")[0]) == 1
            with pytest.raises(HTTPException) as refused:
                await h.async_pre_call_hook(_auth(), None, second, "acompletion")
            assert refused.value.status_code == 429
            assert await h.release(first, "success")
            assert check.zcard(names("inflight:", "litellm:team:t")[0]) == 0
        finally:
            await h.close()

    asyncio.run(run())


def test_litellms_own_redis_variables_and_a_sentinel_url(redis_url: str) -> None:
    pytest.importorskip("litellm")
    from inflight_client.litellm import Settings, redis_client

    server = redis_server()
    assert server is not None
    port = int(redis_url.rsplit(":", 1)[1])
    check = redis.Redis(port=port)
    # LiteLLM's REDIS_HOST / REDIS_PORT (no INFLIGHT_REDIS_URL): the client the handler makes.
    client = redis_client("", {"REDIS_HOST": "127.0.0.1", "REDIS_PORT": str(port)})
    assert client.connection_pool.connection_kwargs["port"] == port
    _admits_and_refuses(Settings(limits={"team": 1}, redis_url=redis_url), check)
    # A Sentinel set watching the same server: the handler finds its master through it.
    sentinel_port = free_port()
    work = Path(tempfile.mkdtemp())
    (work / "sentinel.conf").write_text(
        f"port {sentinel_port}\nbind 127.0.0.1\nsentinel monitor inflight-test 127.0.0.1 {port} 1\n"
    )
    sentinel = subprocess.Popen(
        [server, str(work / "sentinel.conf"), "--sentinel"], stdout=subprocess.DEVNULL, cwd=work
    )
    try:
        probe = redis.Redis(port=sentinel_port)
        poll(lambda: _master_known(probe), "the sentinel knows its master", 30)
        url = f"redis+sentinel://127.0.0.1:{sentinel_port}/inflight-test"
        _admits_and_refuses(Settings(limits={"team": 1}, redis_url=url), check)
    finally:
        sentinel.kill()
        sentinel.wait()
        check.close()


def _master_known(probe: redis.Redis) -> bool:
    try:
        return probe.execute_command("SENTINEL", "get-master-addr-by-name", "inflight-test") is not None
    except redis.ConnectionError:
        return False
