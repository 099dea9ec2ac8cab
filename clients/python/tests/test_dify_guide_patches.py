"""The patches of docs/dify.md apply to every Dify release from 1.7.2 to 1.16.1 (excerpts of the files as
each release ships them, in tests/fixtures/dify/<release>).

Each ```` ```diff ```` block of the guide is taken as it is written there and checked with
``git apply --check`` (and GNU ``patch --dry-run``, the guide's other way) against every release's
excerpt; then applied, and the lines it adds must be Python where they land.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "dify.md"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "dify"
VERSIONS = sorted(
    (p.name for p in FIXTURES.iterdir() if p.is_dir()), key=lambda v: tuple(int(n) for n in v.split("."))
)
RATE_LIMIT = "api/core/app/features/rate_limiting/rate_limit.py"
EXT_REDIS = "api/extensions/ext_redis.py"


def guide_patches() -> dict[str, str]:
    """The guide's diff blocks, by the file each changes."""
    patches: dict[str, str] = {}
    for block in re.findall(r"^```diff\n(.*?)^```", GUIDE.read_text(), re.S | re.M):
        target = re.search(r"^\+\+\+ b/(\S+)", block, re.M)
        assert target is not None, f"a diff block of the guide names no file:\n{block}"
        patches[target.group(1)] = block
    return patches


def test_the_guide_has_both_patches_and_the_excerpts_cover_the_releases() -> None:
    assert set(guide_patches()) == {RATE_LIMIT, EXT_REDIS}
    releases = {"1.13.0", "1.13.1", "1.13.2", "1.14.0", "1.14.1", "1.14.2", "1.15.0", "1.16.0", "1.16.1"}
    assert set(VERSIONS) >= releases | {"1.12.1", "1.7.2"}
    for version in VERSIONS:
        assert {str(p.relative_to(FIXTURES / version)) for p in (FIXTURES / version).rglob("*.py")} == {
            RATE_LIMIT,
            EXT_REDIS,
        }


def added_lines(patch: str) -> str:
    return "".join(
        line[1:] + "\n" for line in patch.splitlines() if line.startswith("+") and line[:3] != "+++"
    )


def checkout(version: str, tmp_path: Path) -> Path:
    tree = tmp_path / version
    shutil.copytree(FIXTURES / version, tree)
    subprocess.run(["git", "init", "-q"], cwd=tree, check=True)  # paths resolve from here, not the repo
    return tree


def run(cmd: list[str], cwd: Path, patch: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, input=patch, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("target", sorted(guide_patches()))
def test_a_patch_of_the_guide_applies(version: str, target: str, tmp_path: Path) -> None:
    patch = guide_patches()[target]
    tree = checkout(version, tmp_path)
    checked = run(["git", "apply", "--check", "-v"], tree, patch)
    assert checked.returncode == 0, checked.stderr
    if shutil.which("patch"):
        dry = run(["patch", "-p1", "--dry-run", "--batch"], tree, patch)
        assert dry.returncode == 0, dry.stdout + dry.stderr
        assert "fuzz" not in dry.stdout, dry.stdout  # exact context, as git apply needs it
    applied = run(["git", "apply"], tree, patch)
    assert applied.returncode == 0, applied.stderr
    patched = (tree / target).read_text()
    added = added_lines(patch)
    assert added in patched
    if target == RATE_LIMIT:
        # At the module's end, at the top level: the names it binds replace Dify's for every importer.
        assert patched.endswith(added)
        compile(added, target, "exec")
        assert "from inflight_client.dify import RateLimit, RateLimitGenerator, rate_limit_context" in added
    else:
        # In init_app's body (indented as it), after redis_client is set up.
        compile("def init_app(app):\n" + added, target, "exec")
        assert patched.index('app.extensions["redis"] = redis_client') < patched.index("configure(")


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


def nginx_t(tmp_path: Path, locations: str) -> subprocess.CompletedProcess[str]:
    """``nginx -t`` of a server of Dify's shape (its template's other locations) holding ``locations``. No
    name of Dify's compose (``api``, ``web``, ``inflight``) resolves on this machine, as none does while its
    container is not up."""
    nginx = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
    if nginx is None:
        pytest.skip("nginx is not installed (scripts/test.sh installs it)")
    (tmp_path / "proxy.conf").write_text(PROXY_CONF)
    temp = "".join(f"{kind}_temp_path {tmp_path}/{kind};\n" for kind in ("client_body", "proxy", "fastcgi"))
    temp += "".join(f"{kind}_temp_path {tmp_path}/{kind};\n" for kind in ("uwsgi", "scgi"))
    conf = tmp_path / "nginx.conf"
    conf.write_text(
        f"pid {tmp_path}/nginx.pid;\nerror_log stderr;\nevents {{}}\nhttp {{\n{temp}access_log off;\n"
        "server {\n  listen 127.0.0.1:8080;\n"
        "  location /console/api {\n    resolver 127.0.0.11 valid=30s ipv6=off;\n"
        "    set $api_upstream api:5001;\n    proxy_pass http://$api_upstream;\n"
        "    include proxy.conf;\n  }\n"
        f"{locations}}}\n}}\n"
    )
    return subprocess.run(
        [nginx, "-t", "-p", str(tmp_path), "-c", str(conf), "-e", "stderr"],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_guides_nginx_block_passes_nginx_t_with_no_upstream_up(tmp_path: Path) -> None:
    block = guide_nginx()
    checked = nginx_t(tmp_path, block)
    assert checked.returncode == 0, checked.stderr
    # Every location resolves its upstream at request time: a resolver and a variable in proxy_pass.
    locations = re.findall(r"location [^{]+\{(.*?)\}", block, re.S)
    assert len(locations) == 8
    for body in locations:
        assert "resolver 127.0.0.11" in body and re.search(r"proxy_pass http://\$\w+;", body), body
    for route in ("/v1", "/openapi", "/mcp"):
        assert f"location {route} " in block or f"location ~ ^{route}" in block


def test_a_static_upstream_stops_nginx_while_its_container_is_down(tmp_path: Path) -> None:
    # What the guide's earlier block did (a plain proxy_pass to inflight): nginx refuses the configuration.
    static = "  location /v1 {\n    proxy_pass http://inflight:8080;\n    include proxy.conf;\n  }\n"
    checked = nginx_t(tmp_path, static)
    assert checked.returncode != 0 and "host not found" in checked.stderr, checked.stderr
