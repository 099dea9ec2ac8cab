"""Fixtures: a real redis-server on a free port, the inflight binary, and ``inflight serve``.

The redis-server is the one ``INFLIGHT_REDIS_SERVER`` names (a path), else ``redis-server`` from the PATH;
``redis-cli`` the one beside it, else the PATH's. ``scripts/test.sh`` runs the tests once more on Redis 6.2
that way.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from inflight_client import RedisLimiter, dify

ROOT = Path(__file__).resolve().parent.parent  # clients/python


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_server() -> str | None:
    """The redis-server to run: ``INFLIGHT_REDIS_SERVER``, else ``redis-server`` from the PATH."""
    return os.environ.get("INFLIGHT_REDIS_SERVER") or shutil.which("redis-server")


def redis_cli() -> str | None:
    """The redis-cli beside ``INFLIGHT_REDIS_SERVER`` (the same version) if there is one, else the PATH's."""
    server = os.environ.get("INFLIGHT_REDIS_SERVER")
    if server:
        beside = Path(server).parent / "redis-cli"
        if beside.is_file() and os.access(beside, os.X_OK):
            return str(beside)
    return shutil.which("redis-cli")


def server_major(server: str) -> int:
    """The major version of ``server`` (``redis-server --version``: ``... v=7.0.15 ...``)."""
    out = subprocess.run([server, "--version"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"\bv=(\d+)\.", out)
    if found is None:
        raise RuntimeError(f"no version in {server} --version: {out!r}")
    return int(found.group(1))


def free_cluster_port() -> int:
    """A free port whose cluster bus port (``port + 10000``, Redis 6's only choice) is free as well."""
    while True:
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    server = redis_server()
    if server is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    else:
        proc.kill()
        raise RuntimeError("redis-server did not start")
    client.close()
    yield f"redis://127.0.0.1:{port}"
    proc.kill()
    proc.wait()


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def two(redis_url: str, r: redis.Redis) -> Iterator[list[RedisLimiter]]:
    """Two limiters (two 'processes', each with its own connection pool) with a limit of 1."""
    limiters = [RedisLimiter(redis.Redis.from_url(redis_url), default_limit=1) for _ in range(2)]
    yield limiters
    for limiter in limiters:
        limiter.close()


@pytest.fixture
def limiter(r: redis.Redis) -> Iterator[RedisLimiter]:
    lim = RedisLimiter(r, default_limit=2)
    yield lim
    lim.close()


@pytest.fixture(autouse=True)
def _fresh_dify() -> Iterator[None]:
    dify.RateLimit._instance_dict.clear()
    yield
    dify.RateLimit._instance_dict.clear()


def inflight_bin() -> Path | None:
    env = os.environ.get("INFLIGHT_BIN")
    candidates = [Path(env)] if env else []
    candidates.append(ROOT.parent.parent / "target" / "debug" / "inflight")
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    return None


@pytest.fixture(scope="session")
def inflight() -> Path:
    path = inflight_bin()
    if path is None:
        pytest.skip("the inflight binary was not found (set INFLIGHT_BIN or cargo build -p inflight-server)")
    return path


class Serve:
    def __init__(self, proc: subprocess.Popen[bytes], url: str) -> None:
        self.proc = proc
        self.url = url


def start_serve(binary: Path, *args: str) -> Serve:
    proc = subprocess.Popen(
        [str(binary), "serve", "--listen", "127.0.0.1:0", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = proc.stderr.readline().decode(errors="replace")
        if not line and proc.poll() is not None:
            break
        found = re.search(r"listen=(\S+)", line)
        if found:
            # Keep draining stderr so that the server never blocks on a full pipe.
            import threading

            threading.Thread(target=lambda: [None for _ in proc.stderr or []], daemon=True).start()
            return Serve(proc, f"http://{found.group(1)}")
    proc.kill()
    raise RuntimeError("inflight serve did not report its listen address")


@pytest.fixture
def serve_factory(inflight: Path) -> Iterator[object]:
    started: list[Serve] = []

    def start(*args: str) -> Serve:
        serve = start_serve(inflight, *args)
        started.append(serve)
        return serve

    yield start
    for serve in started:
        serve.proc.kill()
        serve.proc.wait()


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[int]]:
    """A real Redis Cluster of three primaries (no replicas) on free ports; yields their ports."""
    server, cli = redis_server(), redis_cli()
    if server is None or cli is None:
        pytest.skip("redis-server or redis-cli is not installed")
    workdir = tmp_path_factory.mktemp("cluster")
    # Redis 7 takes the bus port; Redis 6 always uses port + 10000.
    bus = server_major(server) >= 7
    ports = [free_port() if bus else free_cluster_port() for _ in range(3)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for port in ports:
            node_dir = workdir / str(port)
            node_dir.mkdir()
            procs.append(
                subprocess.Popen(
                    [
                        server,
                        "--port",
                        str(port),
                        *(["--cluster-port", str(free_port())] if bus else []),
                        "--bind",
                        "127.0.0.1",
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        str(node_dir / "nodes.conf"),
                        "--dir",
                        str(node_dir),
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        clients = [redis.Redis(port=port) for port in ports]
        _wait_until(lambda: all(_pings(c) for c in clients), 10, "the cluster's nodes did not start")
        subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports)]
            + ["--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=30,
        )

        def ok() -> bool:
            return all(c.cluster("INFO").get("cluster_state") == "ok" for c in clients)

        _wait_until(ok, 20, "the cluster did not reach cluster_state:ok")
        for c in clients:
            c.close()
        yield ports
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def _wait_until(condition: Callable[[], bool], seconds: float, message: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(message)
        time.sleep(0.05)


@pytest.fixture
def counts(r: redis.Redis) -> Iterator[RedisLimiter]:
    """Reads the keys' in-flight counts (and sets a key's limit) in ``r``'s Redis (the middleware's tests)."""
    limiter = RedisLimiter(r, default_limit=2)
    yield limiter
    limiter.close()
