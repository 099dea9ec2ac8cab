"""The package's scripts are byte-for-byte copies of the one source in crates/inflight."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[3] / "crates" / "inflight" / "src" / "store" / "redis" / "scripts"


def test_packaged_scripts_are_copies_of_the_rust_sources() -> None:
    if not SOURCE.is_dir():
        pytest.skip(f"the Rust sources are not here ({SOURCE})")
    packaged = resources.files("inflight_client") / "scripts"
    names = sorted(p.name for p in SOURCE.glob("*.lua"))
    assert names == [
        "batch.lua",
        "busy.lua",
        "common.lua",
        "dify.lua",
        "index.lua",
        "queue.lua",
        "quota.lua",
        "renew.lua",
        "status.lua",
    ]
    for name in names:
        assert (packaged / name).read_bytes() == (SOURCE / name).read_bytes(), (
            f"{name} differs from crates/inflight: run python clients/python/sync_scripts.py"
        )
