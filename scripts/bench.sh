#!/usr/bin/env bash
# Measures inflight side by side with its alternatives, in one run, and writes BENCHMARKS.md and
# docs/latency.svg. About 10 minutes on a 2-core machine (plus the release build).
#
#   scripts/bench.sh            # everything
#   KEEP=1 scripts/bench.sh     # keep the raw results (printed path)
#
# Everything listens on 127.0.0.1 only; every load is bounded in time.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

. scripts/bench/lib.sh
install_missing redis-server=redis-server,redis-tools nginx=nginx wrk=wrk valgrind=valgrind curl=curl

out=$(mktemp -d)
chmod 755 "$out" # nginx's workers read the event-stream file from here
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for conf in upstream proxy; do
    [ -f "$out/$conf.pid" ] && kill "$(cat "$out/$conf.pid")" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  if [ -z "${KEEP:-}" ]; then rm -rf "$out"; else echo "raw results kept in $out" >&2; fi
}
trap cleanup EXIT
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "nothing listens on $1" >&2; return 1; }
say() { echo "== $*" >&2; }

say "building (release)"
cargo build --release -q -p inflight-server -p inflight --bins --examples
bin=$root/target/release/inflight

say "memory store vs per-key tokio semaphore (criterion)"
cargo bench -q -p inflight --bench memory -- --warm-up-time 1 --measurement-time 3 --noplot >"$out/criterion.txt" 2>/dev/null
"$root/target/release/examples/memory_ratio" >"$out/memory_ratio.txt"

redis_port=$(port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$out" >"$out/redis.log" 2>&1 &
pids+=($!)
wait_port "$redis_port"
redis="redis://127.0.0.1:$redis_port"

say "Redis store vs naive check-then-set"
"$root/target/release/examples/redis_load" "$redis" 2 >"$out/redis_load.md"
say "script-call ceiling (redis-benchmark)"
redis-benchmark -p "$redis_port" -c 64 -n 200000 -q EVAL "return 1" 0 2>/dev/null | tr '\r' '\n' | grep -a "requests per second" | tail -1 >"$out/ceiling_unpipelined.txt"
redis-benchmark -p "$redis_port" -c 64 -n 1000000 -P 16 -q EVAL "return 1" 0 2>/dev/null | tr '\r' '\n' | grep -a "requests per second" | tail -1 >"$out/ceiling_pipelined.txt"

say "latency vs concurrency"
for store in memory:// "$redis"; do
  for tasks in 1 16 64 256; do
    # Redis's own time per operation at 64 tasks, from its command statistics.
    stats=""; if [ "$store" = "$redis" ] && [ "$tasks" = 64 ]; then stats=1; fi
    if [ -n "$stats" ]; then redis-cli -p "$redis_port" CONFIG RESETSTAT >/dev/null; fi
    "$bin" bench --store "$store" --tasks "$tasks" --duration 2s --redis-prefix "c$tasks:" >>"$out/concurrency.jsonl"
    if [ -n "$stats" ]; then redis-cli -p "$redis_port" INFO commandstats >"$out/commandstats-64.txt"; fi
  done
done
say "Redis CPU per pair, beside the reference system's traffic"
# Redis's own CPU (INFO cpu) around each run, per acquire+release pair; two rounds, the loads in turn.
for round in 1 2; do
  for load in "64 1" "64 64" "1 1"; do
    set -- $load
    "$bin" bench --store "$redis" --tasks "$1" --keys "$2" --limit 1000000 --duration 4s \
      --redis-prefix "cpu$round-$1-$2:" >>"$out/redis_cpu.jsonl"
  done
  for procs in 4 1; do python3 scripts/bench/reference.py "$redis_port" 4 "$procs" >>"$out/redis_cpu.jsonl"; done
  # What one round trip (a PING) costs Redis from one client: the floor under one task's two.
  python3 scripts/bench/reference.py "$redis_port" 2 1 ping >>"$out/redis_cpu.jsonl"
done
# And what the scripts cost Redis in instructions (callgrind; steady where CPU time is not).
python3 scripts/bench/redis_instructions.py 100 >"$out/redis_instructions.md"
# The same load at 64 tasks on a runtime of two threads (the default is one), each store in turn.
for store in memory:// "$redis"; do
  "$bin" bench --store "$store" --tasks 64 --threads 2 --duration 2s --redis-prefix "t2:" >>"$out/concurrency.jsonl"
done
# And with one batch out to Redis at a time (the servers' default) instead of the library's three.
"$bin" bench --store "$redis" --tasks 64 --redis-pipeline 1 --duration 2s --redis-prefix "p1:" >>"$out/concurrency.jsonl"
say "scaling with keys"
for store in memory:// "$redis"; do
  for keys in 1 100 10000 100000; do
    "$bin" bench --store "$store" --tasks 64 --keys "$keys" --duration 2s --redis-prefix "k$keys:" >>"$out/keys.jsonl"
  done
done
say "scaling with permits held per key"
for store in memory:// "$redis"; do
  for held in 1 100 1000 10000; do
    "$bin" bench --store "$store" --tasks 16 --held "$held" --duration 2s --redis-prefix "h$held:" >>"$out/held.jsonl"
  done
done

say "unlimited keys and the view of overrides"
# Keys no rule limits, with no override: admitted from the process's view, no round trip.
for store in memory:// "$redis"; do
  "$bin" bench --store "$store" --tasks 64 --limit 0 --duration 2s --redis-prefix "u:" >>"$out/unlimited.jsonl"
done
"$root/target/release/examples/override_spread" "$redis" >"$out/override_spread.json"

say "waiting for a slot"
"$root/target/release/examples/wait_load" "$redis" >"$out/wait.jsonl"
# The same across two OS processes (issue 31; scripts/bench/waiting.sh compares builds).
"$root/target/release/examples/wait_load" "$redis" --procs 2 >>"$out/wait.jsonl"

say "Redis topologies (one Redis, Cluster, Sentinel) and --redis-wait-replicas"
scripts/bench/topologies.sh "$out" "$bin"

say "Redis memory per held permit"
# Real permits held through the library, on one key: one sorted set.
"$root/target/release/examples/redis_memory" "$redis" 100 1000 10000 100000 >"$out/memory.txt"

say "proxy vs direct vs nginx limit_conn (wrk)"
up=$(port); ng=$(port); pm=$(port); pr=$(port)
# The upstream and the nginx proxy are two nginx instances, so that the proxy under test, nginx or
# inflight, never shares a process with the upstream it fronts. The proxy gets Debian's default of one
# worker per core.
write_nginx_proxy "$out" "$ng" "$up"
start_upstream "$out" "$up"
nginx -c "$out/proxy.conf" -p "$out" -e "$out/nginx-error.log"
wait_port "$up"; wait_port "$ng"
INFLIGHT_LOG=warn "$bin" proxy --listen "127.0.0.1:$pm" --admin-listen 127.0.0.1:0 --upstream "http://127.0.0.1:$up" --default-limit 100000 &
pids+=($!); memory_pid=$!
INFLIGHT_LOG=warn "$bin" proxy --listen "127.0.0.1:$pr" --admin-listen 127.0.0.1:0 --upstream "http://127.0.0.1:$up" --default-limit 100000 --store "$redis" --redis-prefix proxy: &
pids+=($!); redis_proxy_pid=$!
# The Redis proxy once more with the library's pipeline of three batches instead of the servers' one.
pr3=$(port)
INFLIGHT_LOG=warn "$bin" proxy --listen "127.0.0.1:$pr3" --admin-listen 127.0.0.1:0 --upstream "http://127.0.0.1:$up" --default-limit 100000 --store "$redis" --redis-prefix proxy3: --redis-pipeline 3 &
pids+=($!); redis_p3_pid=$!
# The memory proxy once more under Linux's SCHED_BATCH policy, as the README suggests beside a busy upstream.
pb=$(port)
INFLIGHT_LOG=warn chrt --batch 0 "$bin" proxy --listen "127.0.0.1:$pb" --admin-listen 127.0.0.1:0 --upstream "http://127.0.0.1:$up" --default-limit 100000 &
pids+=($!); batch_pid=$!
# The floor: hyper's server and client on the same runtime layout, forwarding and nothing else.
pf=$(port)
"$root/target/release/examples/hyper_floor" "127.0.0.1:$pf" "127.0.0.1:$up" &
pids+=($!); floor_pid=$!
wait_port "$pm"; wait_port "$pr"; wait_port "$pr3"; wait_port "$pb"; wait_port "$pf"
redis_pid=$(redis-cli -p "$redis_port" INFO server | tr -d '\r' | sed -n 's/^process_id://p')
# CPU time (clock ticks, user and system) of processes and all their threads, from /proc.
cpu_ticks() {
  local user=0 system=0 pid stat fields
  for pid in "$@"; do
    for stat in /proc/"$pid"/task/*/stat; do
      read -r -a fields < <(sed 's/.*) //' "$stat") || continue
      user=$((user + fields[11])); system=$((system + fields[12]))
    done
  done
  echo "$user $system"
}
# Voluntary context switches of a process's threads: how often they blocked (and were woken again).
switches() {
  { cat /proc/"$1"/task/*/status 2>/dev/null || true; } |
    awk '/^voluntary_ctxt_switches/ { n += $2 } END { print n + 0 }'
}
switches_of() { local n=0 pid; for pid in "$@"; do n=$((n + $(switches "$pid"))); done; echo "$n"; }
declare -A cpu_pids=(
  [nginx]="$(pgrep -P "$(cat "$out/proxy.pid")" | tr '\n' ' ')"
  [inflight-memory]="$memory_pid"
  [inflight-memory-batch]="$batch_pid"
  [inflight-redis]="$redis_proxy_pid"
  [inflight-redis-p3]="$redis_p3_pid"
  [hyper-floor]="$floor_pid"
)
# Five rounds, the seven targets in turn within each: the table gives each target's median round and the
# range of its ratio to nginx over the rounds (each ratio within one round).
for path in / /sse; do
  for round in 1 2 3 4 5; do
    for target in "direct $up" "nginx $ng" "hyper-floor $pf" "inflight-memory $pm" "inflight-memory-batch $pb" "inflight-redis $pr" "inflight-redis-p3 $pr3"; do
      set -- $target
      # The proxy's CPU per request (and, behind the Redis proxy, Redis's), read around the run.
      watched=${cpu_pids[$1]:-}
      before="$(cpu_ticks $watched) $(cpu_ticks $redis_pid)"
      switched=$(switches_of $watched)
      wrk -t2 -c64 -d3s --latency -H "X-Inflight-Key: app-1" "http://127.0.0.1:$2$path" >"$out/wrk-$1-${path//\//_}-$round.txt"
      if [ -n "$watched" ]; then
        echo "$(getconf CLK_TCK) $before $(cpu_ticks $watched) $(cpu_ticks $redis_pid)" >"$out/cpu-$1-${path//\//_}-$round.txt"
        echo "$switched $(switches_of $watched)" >"$out/switches-$1-${path//\//_}-$round.txt"
      fi
    done
  done
done

say "instructions per proxied request (callgrind)"
scripts/instructions.sh >"$out/instructions.txt" 2>/dev/null

say "rendering BENCHMARKS.md and docs/latency.svg"
python3 scripts/bench/render.py "$out" "$root"
