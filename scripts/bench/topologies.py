"""The section of BENCHMARKS.md on Redis topologies and --redis-wait-replicas, from topologies.jsonl.

Used by render.py; alone: ``python3 scripts/bench/topologies.py RAW_DIR`` prints the section.
"""

import json
import sys
from pathlib import Path

NAMES = {
    "standalone": "one Redis (with a replica)",
    "cluster": "Redis Cluster, 3 primaries + 3 replicas",
    "sentinel": "primary + replica through 3 sentinels",
}


def section(raw: Path) -> list[str]:
    path = raw / "topologies.jsonl"
    if not path.exists():
        return []
    runs: dict[tuple[str, int], list[dict]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            runs.setdefault((r["topology"], r["redis_wait_replicas"]), []).append(r)
    out = [
        "## Redis topologies, and waiting for replicas",
        "",
        "`inflight bench --tasks 64 --keys 64 --duration 2s` on each topology (`scripts/bench/topologies.sh`;",
        "every server on this machine's loopback and its cores, so a cluster's gain, more machines, is not",
        "measured here), without and with `--redis-wait-replicas 1`, which makes each batch of admissions wait",
        "for one replica's acknowledgement (Redis `WAIT`) before it is answered (RELIABILITY.md, \"Failover\",",
        "says what that buys). The median of three rounds (by pairs/s), the rounds' range in brackets.",
        "",
        "| topology | wait for replicas | pairs/s | p50 µs | p99 µs |",
        "|---|---|---|---|---|",
    ]
    for (topology, wait), rs in runs.items():
        rs.sort(key=lambda r: r["pairs_per_sec"])
        mid = rs[len(rs) // 2]
        low, high = rs[0]["pairs_per_sec"], rs[-1]["pairs_per_sec"]
        pairs = f"{mid['pairs_per_sec']:,.0f} ({low:,.0f}–{high:,.0f})"
        name = NAMES.get(topology, topology)
        out.append(f"| {name} | {wait} | {pairs} | {mid['p50_us']:.0f} | {mid['p99_us']:.0f} |")
    out.append("")
    costs = []
    for (topology, wait), rs in runs.items():
        base = runs.get((topology, 0))
        if wait and base:
            ratio = sorted(r["pairs_per_sec"] for r in rs)[len(rs) // 2] / sorted(
                r["pairs_per_sec"] for r in base
            )[len(base) // 2]
            costs.append(f"{NAMES.get(topology, topology)}: {ratio:.2f}x the pairs/s")
    if costs:
        out += [
            "Waiting for one replica made " + "; ".join(costs) + ". Each batch costs a replica round",
            "trip more, and `WAIT` holds the connection it is sent on until the replica answers or the",
            "timeout passes. So while fewer than N replicas answer, every batch waits the whole",
            "`--redis-wait-timeout`, one after another on a connection: admissions slow to about",
            "`--redis-pipeline` batches per timeout. Ask for no more replicas than are up, and keep the timeout",
            "short. What it buys: an admission answered is on N replicas, so a failover to one of them loses",
            "none.",
            "",
        ]
    return out


if __name__ == "__main__":
    print("\n".join(section(Path(sys.argv[1]))))
