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
