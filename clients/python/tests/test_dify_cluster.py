"""The Dify drop-in on a real Redis Cluster (Dify's ``REDIS_USE_CLUSTERS``: its ``redis_client`` is then a
``redis.cluster.RedisCluster``): inflight's layout works there, every app's keys in its own slot; the
``dify`` layout is refused at ``configure`` (an app's hash and its limit key are in different slots)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from redis.cluster import RedisCluster

from inflight_client import dify
from inflight_client._keys import names

APPS = ["app-a", "app-b", "app-c", "app-d", "app-e", "app-f"]


@pytest.fixture
def cluster(redis_cluster: list[int]) -> Iterator[RedisCluster]:
    client = RedisCluster(host="127.0.0.1", port=redis_cluster[0])
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    yield client
    client.close()


def test_apps_are_on_different_nodes(cluster: RedisCluster) -> None:
    nodes = {
        cluster.get_node_from_key(  # type: ignore[no-untyped-call]
            names("inflight:", f"app:{app}")[0]
        ).name
        for app in APPS
    }
    assert len(nodes) >= 2, nodes  # else the test below would not cross nodes


def test_drop_in_admits_renews_and_releases_on_a_cluster(cluster: RedisCluster) -> None:
    limiter = dify.configure(cluster, lease=0.6)
    try:
        held: dict[str, list[str]] = {}
        for app in APPS:
            limit = dify.RateLimit(app, 2)
            held[app] = [limit.enter(), limit.enter()]
            with pytest.raises(dify.AppInvokeQuotaExceededError):
                limit.enter()
            assert limiter.status(f"app:{app}").in_flight == 2
        # Past three leases, every slot is still held: renewed on each app's own node.
        time.sleep(2.0)
        for app in APPS:
            assert limiter.status(f"app:{app}").in_flight == 2
            with pytest.raises(dify.AppInvokeQuotaExceededError):
                dify.RateLimit(app, 2).enter()
        for app in APPS:
            limit = dify.RateLimit(app, 2)
            limit.exit(held[app][0])
            stream = limit.generate(iter(["a", "b"]), held[app][1])
            assert list(stream) == ["a", "b"]
            # (A renewal on its way when a slot was given back may put its lease back for a moment: the
            # renewer gives it back again. Bounded.)
            deadline = time.monotonic() + 5
            while limiter.status(f"app:{app}").in_flight != 0:
                assert time.monotonic() < deadline, f"app {app} still held"
                time.sleep(0.02)
    finally:
        limiter.close()


def test_an_override_set_through_the_limiter_applies_and_is_indexed(cluster: RedisCluster) -> None:
    limiter = dify.configure(cluster)
    try:
        limit = dify.RateLimit("app-a", 5)
        assert limiter.set_limit("app:app-a", 1).limit == 1
        # The Rust processes' index of overrides, in its own slot as theirs on a cluster.
        assert cluster.hget("inflight:{overrides}", "app:app-a") == b"1"
        request_id = limit.enter()
        with pytest.raises(dify.AppInvokeQuotaExceededError, match="is 1"):
            limit.enter()
        limit.exit(request_id)
        status = limiter.clear_limit("app:app-a")
        assert (status.override, status.in_flight) == (None, 0)
        assert cluster.hget("inflight:{overrides}", "app:app-a") is None
    finally:
        limiter.close()


class Wrapper:
    """As Dify's ``RedisClientWrapper``: hands every attribute on to the client it wraps."""

    def __init__(self, client: RedisCluster) -> None:
        self._client = client

    def __getattr__(self, item: str) -> object:
        return getattr(self._client, item)


@pytest.mark.parametrize("wrapped", [False, True])
def test_the_dify_layout_is_refused_on_a_cluster_at_configure(cluster: RedisCluster, wrapped: bool) -> None:
    previous = dify.configure(cluster)
    client = Wrapper(cluster) if wrapped else cluster
    try:
        with pytest.raises(ValueError, match="Dify layout cannot run on Redis Cluster.*different slots"):
            dify.configure(client, layout="dify")  # type: ignore[arg-type]
        # The configuration in force stays.
        assert dify._configured().limiter is previous
    finally:
        previous.close()
