#!/usr/bin/env bash
# Redis CPU per acquire+release pair: the redis-server process's own CPU time (user + system, from
# /proc/PID/stat) around one `inflight bench` run on a fresh redis-server, divided by the pairs made.
#
#   scripts/bench/redis-cpu.sh BINARY TASKS KEYS SECONDS     # e.g. target/release/inflight 64 1 4
#
# Listens on 127.0.0.1 only; the redis-server is stopped at the end.
set -euo pipefail
bin=$1 tasks=$2 keys=$3 secs=$4
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no >/dev/null 2>&1 &
redis=$!
trap 'kill "$redis" 2>/dev/null || true' EXIT
sleep 0.5
cpu() { awk '{print $14 + $15}' "/proc/$redis/stat"; }
before=$(cpu)
line=$("$bin" bench --store "redis://127.0.0.1:$port" --tasks "$tasks" --keys "$keys" --limit 1000000 \
  --duration "${secs}s" 2>/dev/null | tail -1)
after=$(cpu)
python3 - "$line" "$before" "$after" "$(getconf CLK_TCK)" <<'PY'
import json, sys
line, before, after, tick = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
run = json.loads(line)
pairs = run["pairs_per_sec"] * run["duration_s"]
print(f"pairs/s {run['pairs_per_sec']:.0f}  redis_cpu_us_per_pair {(after - before) / tick * 1e6 / pairs:.2f}")
PY
