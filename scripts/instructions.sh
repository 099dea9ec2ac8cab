#!/usr/bin/env bash
# Instructions per proxied request, counted by valgrind's callgrind: the proxy (one worker) on the memory
# store with its access line (the default, written to a file) and without it (--access-log false), on a
# Redis store (a redis-server of the script's own; only the proxy's user space is counted, Redis's work is
# its own process's), hyper alone (examples/hyper_floor) and nginx with `limit_conn` (one process, as
# scripts/bench.sh configures it), each in front of the same nginx upstream. Unlike requests/s on a shared
# 2-core machine, the count moves by well under 1 % between runs, so a change of a few hundred
# instructions shows. (It counts user space only: the kernel's share, about two thirds of a proxied
# request's CPU time, is alike for all of them.) About 2.5 minutes plus the release build.
#
#   scripts/instructions.sh [PATH]     # default /; keeps the callgrind files when KEEP=1 (printed path)
#
# Everything listens on 127.0.0.1 only; every load is bounded in time.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
path=${1:-/}

. scripts/bench/lib.sh
install_missing valgrind=valgrind nginx=nginx wrk=wrk curl=curl redis-server=redis-server
cargo build --release -q -p inflight-server --bins --examples

out=$(mktemp -d)
chmod 755 "$out"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  [ -f "$out/upstream.pid" ] && kill "$(cat "$out/upstream.pid")" 2>/dev/null || true
  [ -n "${redis_pid:-}" ] && kill "$redis_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  if [ -z "${KEEP:-}" ]; then rm -rf "$out"; else echo "callgrind files kept in $out" >&2; fi
}
trap cleanup EXIT

up=$(port)
start_upstream "$out" "$up"

# measure NAME PORT COMMAND...: runs COMMAND under callgrind, loads PORT, dumps the counts of the loaded
# run, prints Ir/request.
measure() {
  local name=$1 listen=$2; shift 2
  valgrind --tool=callgrind --callgrind-out-file="$out/$name.%p" "$@" >"$out/$name.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  for _ in $(seq 150); do
    curl -s -o /dev/null -H 'X-Inflight-Key: k' "http://127.0.0.1:$listen/" && break
    sleep 0.2
  done
  # Warmed up (connections pooled, metrics calibrated), then counted from zero: start-up is left out.
  wrk -t1 -c8 -d2s -H 'X-Inflight-Key: app-1' "http://127.0.0.1:$listen$path" >/dev/null
  callgrind_control -z "$pid" >/dev/null 2>&1 || true
  local requests
  requests=$(wrk -t1 -c8 -d8s -H 'X-Inflight-Key: app-1' "http://127.0.0.1:$listen$path" | awk '/requests in/ {print $1}')
  callgrind_control -d "$pid" >/dev/null 2>&1 || true
  sleep 2
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  local file total
  file=$(ls -S "$out/$name".* | grep -v '\.log$' | head -1)
  total=$(callgrind_annotate "$file" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
  echo "$name $path: $requests requests, $((total / requests)) instructions per request"
}

# A Redis of its own, in memory only, stopped at the end.
rp=$(port)
redis-server --port "$rp" --bind 127.0.0.1 --save '' --appendonly no --dir "$out" >"$out/redis.log" 2>&1 &
redis_pid=$!
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$rp") 2>/dev/null && break; sleep 0.1; done

# proxy NAME [ARG]...: the proxy (one worker) under callgrind, with ARGs; its log (the access lines at
# the default level, info) goes to NAME.log.
proxy() {
  local name=$1 listen
  shift
  listen=$(port)
  INFLIGHT_LOG=info measure "$name" "$listen" "$root/target/release/inflight" proxy --listen "127.0.0.1:$listen" \
    --admin-listen 127.0.0.1:0 --upstream "http://127.0.0.1:$up" --default-limit 100000 --workers 1 "$@"
}

proxy inflight-memory
proxy inflight-memory-no-access-log --access-log false
proxy inflight-redis --store "redis://127.0.0.1:$rp"
pf=$(port)
measure hyper-floor "$pf" "$root/target/release/examples/hyper_floor" "127.0.0.1:$pf" "127.0.0.1:$up" 1
# nginx in the foreground, one process (no master), so that callgrind follows the one doing the work.
pn=$(port)
write_nginx_proxy "$out" "$pn" "$up" "daemon off;" "master_process off;" "worker_processes 1;"
measure nginx "$pn" nginx -c "$out/proxy.conf" -p "$out"
