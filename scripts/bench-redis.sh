#!/usr/bin/env bash
# Starts a throw-away redis-server on a free loopback port and runs the Redis store load example against
# it. Usage: scripts/bench-redis.sh [seconds-per-row]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || { echo "redis-server is not installed (scripts/test.sh installs it)" >&2; exit 1; }

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" --daemonize no >"$dir/log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done

cargo run --release -q -p inflight --example redis_load -- "redis://127.0.0.1:$port" "${1:-3}"
