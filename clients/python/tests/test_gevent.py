"""Under gevent's monkey-patching (as Dify's workers run): the renewal thread is a greenlet, leases stay
renewed while other greenlets run, and the process exits with permits still held."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def test_renewal_and_release_under_gevent(redis_url: str) -> None:
    pytest.importorskip("gevent")
    program = textwrap.dedent(
        f"""
        from gevent import monkey
        monkey.patch_all()
        import gevent, redis
        from inflight_client import RedisLimiter, TooManyRequests
        from inflight_client import dify

        client = redis.Redis.from_url({redis_url!r})
        client.flushall()
        limiter = RedisLimiter(client, default_limit=2, lease=0.6)
        permits = [limiter.try_acquire("g") for _ in range(2)]

        def refused():
            try:
                limiter.try_acquire("g")
            except TooManyRequests:
                return True
            return False

        jobs = [gevent.spawn(gevent.sleep, 2.0) for _ in range(10)]
        gevent.joinall(jobs)          # three leases pass while other greenlets run
        assert all(p.held for p in permits), permits
        assert refused()
        permits[0].release()
        assert limiter.status("g").in_flight == 1
        dify.configure(client)
        rate_limit = dify.RateLimit("app", 1)
        request_id = rate_limit.enter()
        assert list(rate_limit.generate(iter("ab"), request_id)) == ["a", "b"]
        print("ok", flush=True)
        # exits with permits[1] held: the daemon renewer must not keep the process alive
        """
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == "ok"
