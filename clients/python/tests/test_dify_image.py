"""``contrib/dify``: the derived image's install step, run as the Dockerfile runs it, on this machine.

Dify's API image runs from a venv made by uv with no pip in it (``/app/api/.venv``), so the client must be
installed with ``uv pip install --python``. Here ``install.sh`` runs against such a venv (made by ``uv venv``)
and a Dify tree made of Dify 1.16.1's excerpts (``fixtures/dify``); only ``FROM``, ``USER`` and the
``apt-get install patch`` of the Dockerfile are left out (no image registry here).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_dify_guide_patches import EXT_REDIS, FIXTURES, GUIDE, RATE_LIMIT, added_lines, guide_patches

CONTRIB = GUIDE.parents[1] / "contrib" / "dify"
CLIENT = GUIDE.parents[1] / "clients" / "python"


def test_the_images_patch_is_the_guides() -> None:
    assert (CONTRIB / "inflight.patch").read_text() == "".join(
        guide_patches()[t] for t in (RATE_LIMIT, EXT_REDIS)
    )
    dockerfile = (CONTRIB / "Dockerfile").read_text()
    assert re.search(r"^FROM langgenius/dify-api:\$\{DIFY_VERSION\}$", dockerfile, re.M)
    assert "sh /tmp/inflight/install.sh" in dockerfile and dockerfile.rstrip().endswith("USER ${DIFY_USER}")
    assert "ARG DIFY_USER=dify" in dockerfile


def uv() -> str:
    found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("uv is not installed (scripts/test.sh installs it)")
    return found


def test_install_sh_puts_the_client_in_a_pipless_uv_venv_and_patches_dify(tmp_path: Path) -> None:
    context = tmp_path / "context"  # the Dockerfile's build context: contrib/dify and the client's copy
    shutil.copytree(CONTRIB, context)
    ignore = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".ruff_cache")
    shutil.copytree(CLIENT, context / "inflight-client", ignore=ignore)
    app = tmp_path / "app"
    shutil.copytree(FIXTURES / "1.16.1", app)
    venv = app / "api" / ".venv"
    env = {**os.environ, "PATH": f"{Path(uv()).parent}:{os.environ['PATH']}", "DIFY_APP": str(app)}
    subprocess.run(
        [uv(), "venv", "-q", "--python", sys.executable, str(venv)], check=True, env=env, timeout=120
    )
    assert not (venv / "bin" / "pip").exists()  # as in Dify's image
    done = subprocess.run(
        ["sh", str(context / "install.sh")], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for target in (RATE_LIMIT, EXT_REDIS):
        assert added_lines(guide_patches()[target]) in (app / target).read_text()
    check = "import inflight_client.dify, redis; print(inflight_client.dify.RateLimit.__module__)"
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", check], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "inflight_client.dify"
    # Run again (an image rebuilt on top of itself): the patch refuses to apply twice, failing the build.
    again = subprocess.run(["sh", str(context / "install.sh")], env=env, capture_output=True, text=True)
    assert again.returncode != 0
