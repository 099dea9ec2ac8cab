"""The guide's nginx block (docs/dify.md, section 1) in a real nginx, in a server of Dify's shape.

``nginx -t`` passes while no upstream name resolves (as while the inflight containers are down), where a
plain ``proxy_pass http://inflight:8080`` stops nginx. Then nginx runs the block, its names (``api``,
``inflight``, ``inflight-runs``) resolved at request time by a DNS server of the test's own (Docker's is
``127.0.0.11``), in front of three HTTP servers that say who they are: each route reaches the one the
guide says, with its path and query unchanged.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import free_port
from test_dify_guide_patches import GUIDE

# Dify's docker/nginx/proxy.conf.template (every release), with its timeouts filled in as compose does.
PROXY_CONF = """\
proxy_set_header Host $host;
proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
proxy_set_header X-Forwarded-Proto $scheme;
proxy_set_header X-Forwarded-Port $server_port;
proxy_http_version 1.1;
proxy_set_header Connection "";
proxy_buffering off;
proxy_read_timeout 3600s;
proxy_send_timeout 3600s;
"""


def guide_nginx() -> str:
    blocks = re.findall(r"^```nginx\n(.*?)^```", GUIDE.read_text(), re.S | re.M)
    assert len(blocks) == 1, "the guide has one nginx block"
    return str(blocks[0])


def nginx_bin() -> str:
    nginx = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
    if nginx is None:
        pytest.skip("nginx is not installed (scripts/test.sh installs it)")
    return nginx


def write_conf(tmp_path: Path, locations: str, port: int = 8080) -> Path:
    """nginx's configuration: a server of Dify's shape (its template's other API location) holding
    ``locations``, every path under ``tmp_path``."""
    (tmp_path / "proxy.conf").write_text(PROXY_CONF)
    temp = "".join(f"{kind}_temp_path {tmp_path}/{kind};\n" for kind in ("client_body", "proxy", "fastcgi"))
    temp += "".join(f"{kind}_temp_path {tmp_path}/{kind};\n" for kind in ("uwsgi", "scgi"))
    conf = tmp_path / "nginx.conf"
    conf.write_text(
        f"pid {tmp_path}/nginx.pid;\nerror_log stderr;\nevents {{}}\nhttp {{\n{temp}access_log off;\n"
        f"server {{\n  listen 127.0.0.1:{port};\n"
        "  location /console/api {\n    proxy_pass http://127.0.0.1:9;\n    include proxy.conf;\n  }\n"
        f"{locations}}}\n}}\n"
    )
    return conf


def nginx_t(tmp_path: Path, locations: str) -> subprocess.CompletedProcess[str]:
    conf = write_conf(tmp_path, locations)
    cmd = [nginx_bin(), "-t", "-p", str(tmp_path), "-c", str(conf), "-e", "stderr"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_the_guides_nginx_block_passes_nginx_t_with_no_upstream_up(tmp_path: Path) -> None:
    block = guide_nginx()
    checked = nginx_t(tmp_path, block)
    assert checked.returncode == 0, checked.stderr
    # Every location resolves its upstream at request time: a resolver and a variable in proxy_pass.
    locations = re.findall(r"location [^{]+\{(.*?)\}", block, re.S)
    assert len(locations) == 8
    for body in locations:
        assert "resolver 127.0.0.11" in body and re.search(r"proxy_pass http://\$\w+;", body), body


def test_a_static_upstream_stops_nginx_while_its_container_is_down(tmp_path: Path) -> None:
    # What the guide's earlier block did (a plain proxy_pass to inflight): nginx refuses the configuration.
    static = "  location /v1 {\n    proxy_pass http://inflight.invalid:8080;\n    include proxy.conf;\n  }\n"
    checked = nginx_t(tmp_path, static)
    assert checked.returncode != 0 and "host not found" in checked.stderr, checked.stderr


class Dns(threading.Thread):
    """A DNS server on loopback that answers every A question with 127.0.0.1 (TTL 1 s)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.asked: list[str] = []

    def run(self) -> None:
        while True:
            try:
                query, peer = self.sock.recvfrom(512)
            except OSError:
                return
            at, labels = 12, []
            while query[at]:
                labels.append(query[at + 1 : at + 1 + query[at]].decode())
                at += 1 + query[at]
            question = query[12 : at + 5]
            qtype = struct.unpack("!H", query[at + 1 : at + 3])[0]
            self.asked.append(".".join(labels))
            answers = 1 if qtype == 1 else 0
            reply = query[:2] + struct.pack("!HHHHH", 0x8180, 1, answers, 0, 0) + question
            if answers:
                reply += struct.pack("!HHHIH", 0xC00C, 1, 1, 1, 4) + socket.inet_aton("127.0.0.1")
            self.sock.sendto(reply, peer)


def backend(name: str) -> ThreadingHTTPServer:
    """An HTTP server on loopback answering every request with its name and the request's target."""

    class Handler(BaseHTTPRequestHandler):
        def answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            body = json.dumps({"backend": name, "target": self.path}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def dify_nginx(tmp_path: Path) -> Iterator[tuple[str, Dns]]:
    """nginx with the guide's block, its upstream names resolved by ``Dns``, each on a backend of its own."""
    dns = Dns()
    dns.start()
    servers = {name: backend(name) for name in ("api", "inflight", "inflight-runs")}
    block = guide_nginx().replace("resolver 127.0.0.11", f"resolver 127.0.0.1:{dns.port}")
    for name, server in servers.items():
        block, n = re.subn(rf"\b(?<!-){re.escape(name)}:\d+;", f"{name}:{server.server_port};", block)
        assert n > 0, name
    port = free_port()
    conf = write_conf(tmp_path, block, port)
    cmd = [nginx_bin(), "-p", str(tmp_path), "-c", str(conf), "-e", "stderr", "-g", "daemon off;"]
    log = (tmp_path / "nginx.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (tmp_path / "nginx.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "nginx did not listen"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}", dns
    finally:
        proc.send_signal(signal.SIGQUIT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        dns.sock.close()
        for server in servers.values():
            server.shutdown()


ROUTES = [
    ("POST", "/v1/chat-messages?user=a", "inflight"),
    ("POST", "/v1/completion-messages", "inflight"),
    ("POST", "/v1/workflows/run", "inflight"),
    ("POST", "/v1/workflows/wf-1/run", "inflight"),
    ("GET", "/v1/parameters", "inflight"),  # through the proxy, which limits only the runs
    ("POST", "/v1/chat-messages/task-1/stop", "api"),
    ("POST", "/v1/completion-messages/task-1/stop", "api"),
    ("POST", "/v1/workflows/tasks/task-1/stop", "api"),
    ("GET", "/v1/workflows/run/run-1", "api"),
    ("GET", "/v1/workflows/logs?page=2", "api"),
    ("POST", "/openapi/v1/apps/app-1:run", "inflight-runs"),  # Dify 1.16
    ("POST", "/openapi/v1/apps/app-1/run", "inflight-runs"),  # Dify 1.15
    ("GET", "/openapi/v1/apps/app-1", "api"),
    ("POST", "/openapi/v1/apps/app-1/tasks/task-1:stop", "api"),
    ("POST", "/mcp/server/Code-1/mcp", "inflight-runs"),
    ("GET", "/mcp/other", "api"),
]


def test_the_guides_nginx_block_routes_each_route_where_the_guide_says(dify_nginx: tuple[str, Dns]) -> None:
    base, dns = dify_nginx
    for method, target, expected in ROUTES:
        data = b"{}" if method == "POST" else None
        request = urllib.request.Request(base + target, data=data, method=method)
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                reached = json.loads(answer.read())
        except urllib.error.HTTPError as error:
            raise AssertionError(f"{method} {target}: {error.code} {error.read()!r}") from None
        assert reached == {"backend": expected, "target": target}, (method, target)
    # Resolved at request time, by the resolver the block names.
    assert {"api", "inflight", "inflight-runs"} <= set(dns.asked), dns.asked
