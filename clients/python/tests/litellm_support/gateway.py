"""The gateway of test_litellm.py: two real ``litellm`` proxies (replicas) on one redis-server, a fake
upstream, and the calls the tests make through them."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import redis
from conftest import free_port

from inflight_client._keys import names
from litellm_support.upstream import FakeUpstream

REPO = Path(__file__).resolve().parents[4]
SUPPORT = Path(__file__).resolve().parent
LITELLM = Path(os.environ.get("INFLIGHT_LITELLM_BIN", REPO / "target" / "litellm-venv" / "bin" / "litellm"))

# Loopback only: LiteLLM fetches its model cost map from the web at import unless told to use its own copy.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
LEASE = 3.0  # INFLIGHT_LITELLM_LEASE of the replicas
DEADLINE = 90.0  # for any condition polled


def _key(team: str, **extra: object) -> dict[str, object]:
    return {"team_id": team, "user_id": extra.pop("user_id", f"user-of-{team}"), **extra}


def _limit(n: int | None = None, **fields: object) -> dict[str, object]:
    inflight = dict(fields)
    if n is not None:
        inflight["limit"] = n
    return {"inflight": inflight}


KEYS: dict[str, dict[str, object]] = {
    "sk-k1": _key("t-one", metadata=_limit(2)),
    "sk-k2": _key("t-two", max_parallel_requests=2, team_metadata=_limit(3)),
    "sk-k3": _key("t-two", team_metadata=_limit(3)),
    "sk-k4": _key("t-three", metadata=_limit(3)),
    "sk-k5": _key("t-three", metadata=_limit(3)),
    "sk-u1": _key("t-u1", user_id="u-lim"),
    "sk-u2": _key("t-u2", user_id="u-lim"),
    "sk-e1": _key("t-e1"),
    "sk-e2": _key("t-e2"),
    "sk-paths": _key("t-paths"),
    "sk-wait": _key("t-wait", metadata=_limit(1, max_wait=60)),
    "sk-low": _key("t-low", metadata=_limit(max_wait=60)),
    "sk-high": _key("t-high", metadata=_limit(priority=9, max_wait=60)),
    "sk-fa": _key("t-fa", metadata=_limit(max_wait=60)),
    "sk-fb": _key("t-fb", metadata=_limit(max_wait=60)),
    "sk-long": _key("t-long", metadata=_limit(1)),
    "sk-kill": _key("t-kill", metadata=_limit(1)),
}
FILE = {
    "overrides": {
        "model": {"m-limit": 4, "m-prio": 1, "m-fair": 1},
        "user": {"u-lim": 1},
        "end_user": {"eu-1": 1},
    }
}
MODELS = ("m1", "m-limit", "m-prio", "m-fair")


def scope_key(scope: str, value: str) -> str:
    if scope == "key":
        value = hashlib.sha256(value.encode()).hexdigest()
    return f"litellm:{scope}:{value}"


class Proxy:
    """One ``litellm`` process on a free loopback port; its output in ``log_path``."""

    def __init__(self, name: str, config: Path, env: dict[str, str], logs: Path) -> None:
        self.name = name
        self.port = free_port()
        self.log_path = logs / f"{name}.log"
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [str(LITELLM), "--config", str(config), "--host", "127.0.0.1", "--port", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=config.parent,
            )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"litellm {self.name} exited:\n{self.log()[-4000:]}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health/liveliness")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"litellm {self.name} did not start:\n{self.log()[-4000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Call(threading.Thread):
    """One request through a replica, in a thread: its status as soon as it is answered, and (a stream)
    its body until it ends or :meth:`disconnect`."""

    def __init__(
        self,
        proxy: Proxy,
        key: str,
        mode: str = "plain",
        stream: bool = False,
        model: str = "m1",
        labels: dict[str, str] | None = None,
        user: str | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.proxy, self.key, self.stream = proxy, key, stream
        self.tag = f"{key}-{uuid.uuid4().hex[:8]}"
        self.call_id = str(uuid.uuid4())
        order = {"tag": self.tag, "mode": mode, "labels": labels or {}}
        body: dict[str, object] = {
            "model": model,
            "stream": stream,
            "messages": [{"role": "user", "content": json.dumps(order)}],
        }
        if user is not None:
            body["user"] = user
        self.body = json.dumps(body)
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.text = ""
        self.answered = threading.Event()
        self._conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=DEADLINE)
        self.start()

    def run(self) -> None:
        try:
            self._conn.request(
                "POST",
                "/v1/chat/completions",
                body=self.body,
                headers={
                    "authorization": f"Bearer {self.key}",
                    "content-type": "application/json",
                    "x-litellm-call-id": self.call_id,
                },
            )
            response = self._conn.getresponse()
            self.status, self.headers = response.status, {k.lower(): v for k, v in response.getheaders()}
            self.answered.set()
            while True:
                line = response.readline()
                if not line:
                    break
                self.text += line.decode(errors="replace")
        except OSError as error:
            self.text += f"\n<{type(error).__name__}>"
        finally:
            self.answered.set()

    def wait_answered(self) -> int:
        assert self.answered.wait(DEADLINE), f"{self.tag} got no answer"
        assert self.status is not None, f"{self.tag}: {self.text}"
        return self.status

    def disconnect(self) -> None:
        """The client leaves mid-stream."""
        sock = self._conn.sock
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)

    def finished(self) -> str:
        self.join(DEADLINE)
        assert not self.is_alive(), f"{self.tag} did not end"
        return self.text


def poll(condition: Callable[[], bool], what: str, seconds: float = DEADLINE) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}")
        time.sleep(0.05)


class Gateway:
    def __init__(
        self, config: Path, env: dict[str, str], logs: Path, upstream: FakeUpstream, r: redis.Redis
    ) -> None:
        self.config, self.env, self.logs, self.upstream, self.redis = config, env, logs, upstream, r
        self.a = Proxy("a", config, env, logs)
        self.b = Proxy("b", config, env, logs)
        self.extra: list[Proxy] = []
        self.a.wait_ready()
        self.b.wait_ready()

    def leases(self, key: str) -> int:
        return int(self.redis.zcard(names("inflight:", key)[0]))

    def queued(self, key: str) -> int:
        return int(self.redis.zcard(f"{names('inflight:', key)[0].rsplit(':', 1)[0]}:queue"))

    def state(self, key: str) -> dict[str, object]:
        """The key's leases and queue in Redis (for a failure's message)."""
        tag = names("inflight:", key)[0].rsplit(":", 1)[0]
        return {
            "leases": self.redis.zrange(f"{tag}:leases", 0, -1, withscores=True),
            "queue": self.redis.zrange(f"{tag}:queue", 0, -1),
            "tickets": self.redis.hgetall(f"{tag}:tickets"),
            "expiry": self.redis.zrange(f"{tag}:expiry", 0, -1, withscores=True),
            "time": self.redis.time(),
        }

    def wait_queued(self, key: str, n: int) -> None:
        poll(lambda: self.queued(key) == n, f"{n} waiters queued on {key}")

    def releases(self, call_id: str) -> list[str]:
        found = []
        for proxy in [self.a, self.b, *self.extra]:
            found += re.findall(rf"inflight: released {re.escape(call_id)} on (\w+)", proxy.log())
        return found

    def stream(self, proxy: Proxy, key: str, **kw: object) -> Call:
        """A stream held at the upstream (``hold``) once admitted; asserts it was admitted."""
        call = Call(proxy, key, mode=str(kw.pop("mode", "hold")), stream=True, **kw)  # type: ignore[arg-type]
        assert call.wait_answered() == 200, call.text
        self.upstream.wait_started(call.tag)
        return call

    def close(self) -> None:
        for proxy in [self.a, self.b, *self.extra]:
            proxy.stop()
        self.upstream.close()
        self.redis.close()


def open_gateway(redis_url: str, work: Path) -> Gateway:
    """Replicas A and B of LiteLLM's proxy with inflight's callback, on ``redis_url``, calling a fake
    upstream; their files in ``work``."""
    upstream = FakeUpstream()
    shutil.copy(SUPPORT / "auth.py", work / "auth.py")
    (work / "keys.json").write_text(json.dumps(KEYS))
    (work / "inflight.json").write_text(json.dumps(FILE))
    models = "".join(
        f"  - model_name: {m}\n    litellm_params: {{model: openai/fake, api_key: sk-fake, "
        f"api_base: 'http://127.0.0.1:{upstream.port}/v1', timeout: {DEADLINE}}}\n"
        for m in MODELS
    )
    (work / "config.yaml").write_text(
        f"model_list:\n{models}"
        "litellm_settings:\n  callbacks: inflight_client.litellm.handler\n  num_retries: 0\n"
        f"  request_timeout: {DEADLINE}\n"
        "router_settings:\n  num_retries: 0\n"
        "general_settings:\n  master_key: sk-master\n  custom_auth: auth.user_api_key_auth\n"
    )
    env = {
        **os.environ,
        "INFLIGHT_REDIS_URL": redis_url,
        "INFLIGHT_LITELLM_CONFIG": str(work / "inflight.json"),
        "INFLIGHT_LITELLM_KEY_LIMIT": "20",
        "INFLIGHT_LITELLM_TEAM_LIMIT": "30",
        "INFLIGHT_LITELLM_USER_LIMIT": "40",
        "INFLIGHT_LITELLM_GLOBAL_LIMIT": "60",
        "INFLIGHT_LITELLM_LEASE": str(LEASE),
        "INFLIGHT_TEST_KEYS": str(work / "keys.json"),
        "PYTHONUNBUFFERED": "1",
        "NO_PROXY": "*",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "DATABASE_URL", "REDIS_URL"):
        env.pop(name, None)
    r = redis.Redis.from_url(redis_url)
    try:
        return Gateway(work / "config.yaml", env, work, upstream, r)
    except BaseException:
        upstream.close()
        r.close()
        raise
