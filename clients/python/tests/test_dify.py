"""inflight_client.dify.RateLimit: Dify's own tests of RateLimit (api/tests/unit_tests/core/app/features/
rate_limiting/test_rate_limit.py), ported from a mocked Redis to a real one and inflight's scripts."""

from __future__ import annotations

import gc
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from inflight_client import RedisLimiter, StoreError, dify
from inflight_client.dify import AppInvokeQuotaExceededError, RateLimit, RateLimitGenerator


@pytest.fixture
def configured(r: redis.Redis) -> Iterator[RedisLimiter]:
    limiter = dify.configure(r, lease=5.0)
    yield limiter
    limiter.close()


def active(limiter: RedisLimiter, client_id: str) -> int:
    return limiter.status(f"app:{client_id}").in_flight


def sample_generator(raise_error: bool = False) -> Iterator[str]:
    yield "item1"
    if raise_error:
        raise ValueError("Test error")
    yield "item2"
    yield "item3"


class TestRateLimit:
    def test_should_return_same_instance_for_same_client_id(self, configured: RedisLimiter) -> None:
        rate_limit1 = RateLimit("client1", 5)
        rate_limit2 = RateLimit("client1", 10)
        assert rate_limit1 is rate_limit2
        assert rate_limit1.max_active_requests == 10

    def test_should_create_different_instances_for_different_client_ids(
        self, configured: RedisLimiter
    ) -> None:
        rate_limit1 = RateLimit("client1", 5)
        rate_limit2 = RateLimit("client2", 10)
        assert rate_limit1 is not rate_limit2
        assert (rate_limit1.client_id, rate_limit2.client_id) == ("client1", "client2")

    def test_should_initialize_with_valid_parameters(self, configured: RedisLimiter) -> None:
        rate_limit = RateLimit("test_client", 5)
        assert rate_limit.client_id == "test_client"
        assert rate_limit.max_active_requests == 5
        assert hasattr(rate_limit, "initialized")

    def test_should_skip_initialization_if_disabled(self) -> None:
        rate_limit = RateLimit("test_client", 0)
        assert rate_limit.disabled()
        assert not hasattr(rate_limit, "initialized")

    def test_should_be_disabled_when_max_requests_is_zero_or_negative(self) -> None:
        assert RateLimit("client1", 0).disabled()
        assert RateLimit("client2", -5).disabled()


class TestRateLimitEnterExit:
    def test_should_allow_request_within_limit(self, configured: RedisLimiter) -> None:
        rate_limit = RateLimit("test_client", 5)
        request_id = rate_limit.enter()
        assert request_id != RateLimit._UNLIMITED_REQUEST_ID
        assert active(configured, "test_client") == 1

    def test_should_generate_request_id_if_not_provided(self, configured: RedisLimiter) -> None:
        assert len(RateLimit("test_client", 5).enter()) == 36

    def test_should_use_provided_request_id(self, configured: RedisLimiter) -> None:
        assert RateLimit("test_client", 5).enter("custom_request_123") == "custom_request_123"

    def test_should_remove_request_on_exit(self, configured: RedisLimiter) -> None:
        rate_limit = RateLimit("test_client", 5)
        rate_limit.exit(rate_limit.enter("test_request_id"))
        assert active(configured, "test_client") == 0

    def test_should_raise_quota_exceeded_when_at_limit(self, configured: RedisLimiter) -> None:
        rate_limit = RateLimit("test_client", 5)
        for _ in range(5):
            rate_limit.enter()
        with pytest.raises(AppInvokeQuotaExceededError) as exc_info:
            rate_limit.enter()
        assert "Too many requests" in str(exc_info.value)
        assert "test_client" in str(exc_info.value)
        assert "is 5." in str(exc_info.value)
        # Without error=, the drop-in's own class: a TooManyRequests with the key's figures.
        refused = exc_info.value
        assert (refused.limit, refused.in_flight, refused.key) == (5, 5, "app:test_client")

    def test_should_allow_request_after_previous_exit(self, configured: RedisLimiter) -> None:
        rate_limit = RateLimit("test_client", 1)
        request_id = rate_limit.enter()
        rate_limit.exit(request_id)
        assert rate_limit.enter() is not None

    def test_should_return_unlimited_id_when_disabled(self) -> None:
        assert RateLimit("test_client", 0).enter() == RateLimit._UNLIMITED_REQUEST_ID
        assert RateLimit._UNLIMITED_REQUEST_ID == "unlimited_request_id"

    def test_should_ignore_exit_for_unlimited_requests(self) -> None:
        RateLimit("test_client", 0).exit(RateLimit._UNLIMITED_REQUEST_ID)  # no configure: no Redis call

    def test_reentering_a_held_id_counts_once_until_its_last_holder_exits(
        self, configured: RedisLimiter
    ) -> None:
        rate_limit = RateLimit("test_client", 2)
        rate_limit.enter("req")
        rate_limit.enter("req")
        assert active(configured, "test_client") == 1
        rate_limit.enter("other")
        rate_limit.exit("req")
        assert active(configured, "test_client") == 2  # one holder of "req" left
        with pytest.raises(AppInvokeQuotaExceededError):
            rate_limit.enter()
        rate_limit.exit("req")
        assert active(configured, "test_client") == 1

    def test_rate_limit_context_exits_also_when_its_block_raises(self, configured: RedisLimiter) -> None:
        # Dify's pattern: enter, then rate_limit_context enters the same id again; the block fails and
        # the caller exits once. Dify's own context (no finally) would leave one holder: the slot stuck.
        rate_limit = RateLimit("test_client", 2)
        request_id = rate_limit.enter()
        with pytest.raises(ValueError), dify.rate_limit_context(rate_limit, request_id):
            assert active(configured, "test_client") == 1
            raise ValueError("the workflow failed to start")
        rate_limit.exit(request_id)
        assert active(configured, "test_client") == 0

    def test_exit_of_an_id_held_elsewhere_releases_it(self, configured: RedisLimiter) -> None:
        configured.try_acquire("app:test_client", id="elsewhere")._take()  # as if another process held it
        RateLimit("test_client", 5).exit("elsewhere")
        assert active(configured, "test_client") == 0

    def test_the_error_class_is_configurable(self, r: redis.Redis) -> None:
        class DifyQuotaError(Exception):
            pass

        limiter = dify.configure(r, error=DifyQuotaError)
        try:
            rate_limit = RateLimit("c", 1)
            rate_limit.enter()
            with pytest.raises(DifyQuotaError, match="Too many requests"):
                rate_limit.enter()
        finally:
            limiter.close()

    def test_an_override_set_through_inflight_applies(self, configured: RedisLimiter) -> None:
        configured.set_limit("app:test_client", 1)
        rate_limit = RateLimit("test_client", 5)
        rate_limit.enter()
        with pytest.raises(AppInvokeQuotaExceededError, match="is 1"):
            rate_limit.enter()


class TestRateLimitGenerator:
    def test_should_wrap_generator_and_iterate_normally(self, configured: RedisLimiter) -> None:
        rate_limit = RateLimit("test_client", 5)
        request_id = rate_limit.enter("test_request")
        wrapped_gen = rate_limit.generate(sample_generator(), request_id)
        assert isinstance(wrapped_gen, RateLimitGenerator)
        assert active(configured, "test_client") == 1
        assert list(wrapped_gen) == ["item1", "item2", "item3"]
        assert active(configured, "test_client") == 0

    def test_should_handle_mapping_input_directly(self) -> None:
        mapping = {"answer": "x"}
        assert RateLimit("test_client", 0).generate(mapping, "test_request") is mapping

    def test_should_cleanup_on_exception_during_iteration(self, configured: RedisLimiter) -> None:
        rate_limit = RateLimit("test_client", 5)
        wrapped_gen = rate_limit.generate(sample_generator(raise_error=True), rate_limit.enter("r"))
        with pytest.raises(ValueError):
            list(wrapped_gen)
        assert active(configured, "test_client") == 0

    def test_should_cleanup_on_explicit_close(self, configured: RedisLimiter) -> None:
        rate_limit = RateLimit("test_client", 5)
        wrapped_gen = rate_limit.generate(sample_generator(), rate_limit.enter("r"))
        wrapped_gen.close()  # before the first item
        assert active(configured, "test_client") == 0

    def test_should_cleanup_when_closed_midway(self, configured: RedisLimiter) -> None:
        rate_limit = RateLimit("test_client", 5)
        wrapped_gen = rate_limit.generate(sample_generator(), rate_limit.enter("r"))
        assert next(wrapped_gen) == "item1"
        wrapped_gen.close()
        assert active(configured, "test_client") == 0

    def test_should_handle_generator_without_close_method(self, configured: RedisLimiter) -> None:
        class SimpleGenerator:
            def __init__(self) -> None:
                self.items = ["test"]
                self.index = 0

            def __iter__(self) -> SimpleGenerator:
                return self

            def __next__(self) -> str:
                if self.index >= len(self.items):
                    raise StopIteration
                item = self.items[self.index]
                self.index += 1
                return item

        rate_limit = RateLimit("test_client", 5)
        wrapped_gen = rate_limit.generate(SimpleGenerator(), rate_limit.enter("r"))
        wrapped_gen.close()
        assert active(configured, "test_client") == 0

    def test_should_prevent_iteration_after_close(self, configured: RedisLimiter) -> None:
        rate_limit = RateLimit("test_client", 5)
        wrapped_gen = rate_limit.generate(sample_generator(), rate_limit.enter("r"))
        wrapped_gen.close()
        with pytest.raises(StopIteration):
            next(wrapped_gen)

    def test_an_abandoned_generator_gives_its_slot_back(self, configured: RedisLimiter) -> None:
        rate_limit = RateLimit("test_client", 5)
        wrapped_gen = rate_limit.generate(sample_generator(), rate_limit.enter("r"))
        next(wrapped_gen)
        del wrapped_gen
        gc.collect()
        deadline = time.monotonic() + 5
        while active(configured, "test_client") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert active(configured, "test_client") == 0


class TestRateLimitConcurrency:
    def test_should_handle_concurrent_instance_creation(self, configured: RedisLimiter) -> None:
        instances: list[RateLimit] = []
        threads = [
            threading.Thread(target=lambda: instances.append(RateLimit("concurrent_client", 5)))
            for _ in range(10)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len({id(inst) for inst in instances}) == 1

    def test_should_handle_concurrent_enter_requests(self, configured: RedisLimiter) -> None:
        rate_limit = RateLimit("concurrent_client", 3)
        results: list[str] = []
        errors: list[Exception] = []

        def try_enter() -> None:
            try:
                results.append(rate_limit.enter())
            except AppInvokeQuotaExceededError as e:
                errors.append(e)

        threads = [threading.Thread(target=try_enter) for _ in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # Atomic admissions: exactly the limit gets in (Dify's HLEN-then-HSET could let more in).
        assert (len(results), len(errors)) == (3, 2)

    def test_should_maintain_accurate_count_under_load(self, configured: RedisLimiter) -> None:
        rate_limit = RateLimit("load_test_client", 10)
        active_requests: list[str] = []
        most = [0]
        lock = threading.Lock()

        def enter_and_exit() -> None:
            try:
                request_id = rate_limit.enter()
            except AppInvokeQuotaExceededError:
                return
            with lock:
                active_requests.append(request_id)
                most[0] = max(most[0], len(active_requests))
            time.sleep(0.01)
            with lock:
                active_requests.remove(request_id)
            rate_limit.exit(request_id)

        threads = [threading.Thread(target=enter_and_exit) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert active_requests == []
        assert most[0] <= 10
        assert active(configured, "load_test_client") == 0


def test_racing_enters_of_one_id_count_once_and_release_at_the_last_exit(configured: RedisLimiter) -> None:
    rate_limit = RateLimit("race_client", 5)
    barrier = threading.Barrier(8)

    def enter() -> None:
        barrier.wait()
        rate_limit.enter("same")

    threads = [threading.Thread(target=enter) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert active(configured, "race_client") == 1
    for _ in range(7):
        rate_limit.exit("same")
    assert active(configured, "race_client") == 1
    rate_limit.exit("same")
    assert active(configured, "race_client") == 0


def test_an_error_after_redis_admitted_gives_the_slot_back(
    configured: RedisLimiter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As under gunicorn --preload with gevent: a lock made before the patching fails once Redis has admitted.
    def broken(held: object) -> None:
        raise RuntimeError("cannot release un-acquired lock")

    monkeypatch.setattr(configured._renewer, "add", broken)
    rate_limit = RateLimit("client-broken", 1)
    with pytest.raises(RuntimeError, match="un-acquired"):
        rate_limit.enter("request-1")
    assert active(configured, "client-broken") == 0
    monkeypatch.undo()
    assert rate_limit.enter("request-2") == "request-2"  # the slot is free: not held for a lease
    rate_limit.exit("request-2")


def test_an_interrupt_while_waiting_for_the_admission_gives_the_slot_back(
    configured: RedisLimiter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The script ran in Redis, but the caller was interrupted (a gevent Timeout, KeyboardInterrupt) before
    # reading the answer.
    call = configured._call

    def interrupted(script: Any, keys: list[str], args: list[Any]) -> Any:
        call(script, keys, args)
        raise KeyboardInterrupt

    monkeypatch.setattr(configured, "_call", interrupted)
    with pytest.raises(KeyboardInterrupt):
        RateLimit("client-interrupted", 1).enter("request-1")
    monkeypatch.undo()
    assert active(configured, "client-interrupted") == 0


def test_a_redis_outage_fails_closed_or_open_as_configured() -> None:
    # Bound but not listening, kept for the test: connections are refused, and no server of another test
    # is given the port meanwhile.
    refusing = socket.socket()
    refusing.bind(("127.0.0.1", 0))
    port = refusing.getsockname()[1]
    no_retry = Retry(NoBackoff(), 0)
    down = redis.Redis(port=port, socket_connect_timeout=0.2, socket_timeout=0.2, retry=no_retry)
    try:
        dify.configure(down)
        with pytest.raises(StoreError):
            RateLimit("outage", 2).enter()
        dify.configure(down, on_store_failure="fail_open")
        request_id = RateLimit("outage", 2).enter()
        assert request_id == RateLimit._UNLIMITED_REQUEST_ID
        RateLimit("outage", 2).exit(request_id)  # nothing to give back, and no error
        with pytest.raises(ValueError):
            dify.configure(down, on_store_failure="shrug")
    finally:
        dify.configure(down).close()
        refusing.close()
