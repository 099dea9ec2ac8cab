"""Copies inflight's Lua scripts from their one source into the package.

Run from anywhere: ``python clients/python/sync_scripts.py``. The scripts live in
``crates/inflight/src/store/redis/scripts``; the package ships byte-identical copies, and
``tests/test_scripts_in_sync.py`` fails when they differ.
"""

from __future__ import annotations

import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent.parent / "crates" / "inflight" / "src" / "store" / "redis" / "scripts"
TARGET = HERE / "src" / "inflight_client" / "scripts"


def main() -> None:
    TARGET.mkdir(parents=True, exist_ok=True)
    for script in sorted(SOURCE.glob("*.lua")):
        shutil.copyfile(script, TARGET / script.name)
        print(f"copied {script.name}")


if __name__ == "__main__":
    main()
