"""Copies the Lua scripts the client loads from their one source into the package.

Run from anywhere: ``python clients/python/sync_scripts.py``. The scripts live in
``crates/inflight/src/store/redis/scripts``; the package ships byte-identical copies of the manifest and
of the files of the entry points it loads (``LOADED``), and ``tests/test_scripts_in_sync.py`` fails when
they differ.
"""

from __future__ import annotations

import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent.parent / "crates" / "inflight" / "src" / "store" / "redis" / "scripts"
TARGET = HERE / "src" / "inflight_client" / "scripts"
# The entry points the client loads (_redis.py, _async.py).
LOADED = ("batch", "lone", "renew", "status", "dify", "index")


def shipped(manifest: str) -> list[str]:
    """The files the package ships: the manifest, and the files of every entry point it loads."""
    files = {"manifest"}
    for line in manifest.splitlines():
        entry, _, parts = line.partition(" = ")
        if entry in LOADED:
            files.update(parts.split(" "))
    return sorted(files)


def main() -> None:
    TARGET.mkdir(parents=True, exist_ok=True)
    names = shipped((SOURCE / "manifest").read_text("utf-8"))
    for stale in TARGET.iterdir():
        if stale.name not in names:
            stale.unlink()
    for name in names:
        shutil.copyfile(SOURCE / name, TARGET / name)
        print(f"copied {name}")


if __name__ == "__main__":
    main()
