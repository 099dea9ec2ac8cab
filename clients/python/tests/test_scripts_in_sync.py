"""The package ships byte-for-byte copies of the one source in crates/inflight: the manifest and the files
of the entry points it loads, nothing else."""

from __future__ import annotations

import importlib.util
from importlib import resources
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SOURCE = ROOT / "crates" / "inflight" / "src" / "store" / "redis" / "scripts"


def test_packaged_scripts_are_copies_of_the_rust_sources() -> None:
    if not SOURCE.is_dir():
        pytest.skip(f"the Rust sources are not here ({SOURCE})")
    spec = importlib.util.spec_from_file_location("sync_scripts", ROOT / "clients/python/sync_scripts.py")
    assert spec is not None and spec.loader is not None
    sync = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sync)
    names = sync.shipped((SOURCE / "manifest").read_text("utf-8"))
    stems = ["base", "batch", "common", "dify", "index", "lone"]
    assert names == [*(f"{stem}.lua" for stem in stems), "manifest", "queue.lua", "renew.lua", "status.lua"]
    packaged = resources.files("inflight_client") / "scripts"
    assert sorted(p.name for p in packaged.iterdir() if p.is_file()) == names, "only what the client loads"
    for name in names:
        assert (packaged / name).read_bytes() == (SOURCE / name).read_bytes(), (
            f"{name} differs from crates/inflight: run python clients/python/sync_scripts.py"
        )
