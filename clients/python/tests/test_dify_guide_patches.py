"""The patches of docs/dify.md apply to the Dify versions in use (excerpts in tests/fixtures/dify).

Each ```` ```diff ```` block of the guide is taken as it is written there and checked with
``git apply --check`` (and GNU ``patch --dry-run``, the guide's other way) against every version's
excerpt; then applied, and the patched file must still be Python.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "dify.md"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "dify"
VERSIONS = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())


def guide_patches() -> dict[str, str]:
    """The guide's diff blocks, by the file each changes."""
    patches: dict[str, str] = {}
    for block in re.findall(r"^```diff\n(.*?)^```", GUIDE.read_text(), re.S | re.M):
        target = re.search(r"^\+\+\+ b/(\S+)", block, re.M)
        assert target is not None, f"a diff block of the guide names no file:\n{block}"
        patches[target.group(1)] = block
    return patches


def test_the_guide_has_both_patches() -> None:
    assert set(guide_patches()) == {"api/services/app_generate_service.py", "api/extensions/ext_redis.py"}
    assert set(VERSIONS) >= {"older", "newest"}


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
    compile(patched, target, "exec")  # still Python: the inserted lines are indented as their block
    assert "inflight_client.dify" in patched
    if target.endswith("app_generate_service.py"):
        assert "from core.app.features.rate_limiting" not in patched
    else:
        # configure runs in init_app, after redis_client is set up.
        assert patched.index("redis_client.initialize(client)") < patched.index("configure(redis_client")
