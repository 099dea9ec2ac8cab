#!/usr/bin/env bash
# The Redis topologies side by side, and the cost of waiting for replicas: `inflight bench` (64 tasks, 64
# keys so that every cluster primary gets some, 2 s) on one Redis with a replica, a Redis Cluster (3
# primaries, 3 replicas) and a primary found through Sentinel, each without and with
# --redis-wait-replicas 1, three rounds of each. Appends one JSON line per run to OUT/topologies.jsonl.
# Run by scripts/bench.sh; alone:
#
#   scripts/bench/topologies.sh OUT_DIR [path/to/inflight]
#
# Everything listens on 127.0.0.1 and is stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$1
bin=${2:-target/release/inflight}
. scripts/bench/lib.sh
mkdir -p "$out/topologies"
dir=$out/topologies
tpids=()
stop_topologies() { for pid in "${tpids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap stop_topologies EXIT
up() { for _ in $(seq 100); do redis-cli -p "$1" PING >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "redis on $1 did not start" >&2; return 1; }
server() { # PORT ARGS...: a redis-server in $dir
  local p=$1; shift
  redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" --logfile "$dir/$p.log" "$@" &
  tpids+=($!)
}
# A port whose cluster bus port (+10000) is free as well.
bus_port() { local p; while :; do p=$(port); [ "$p" -lt 55000 ] && ! (exec 3<>"/dev/tcp/127.0.0.1/$((p + 10000))") 2>/dev/null && { echo "$p"; return; }; done; }
synced() { for _ in $(seq 100); do redis-cli -p "$1" INFO replication | grep -q 'master_link_status:up' && return 0; sleep 0.1; done; return 1; }
run() { # NAME STORE ARGS...
  local name=$1 store=$2 round wait; shift 2
  for round in 1 2 3; do for wait in 0 1; do
    "$bin" bench --store "$store" --tasks 64 --keys 64 --duration 2s --redis-prefix "$name-w$wait-$round:" --redis-wait-replicas "$wait" "$@" |
      python3 -c "import json,sys; r=json.loads(sys.stdin.read()); r['topology']='$name'; print(json.dumps(r))" >>"$out/topologies.jsonl"
  done; done
}

# One Redis and its replica.
p=$(port); r=$(port)
server "$p"; up "$p"
server "$r" --replicaof 127.0.0.1 "$p"; up "$r"; synced "$r"
run standalone "redis://127.0.0.1:$p"

# A cluster of 3 primaries and 3 replicas.
nodes=()
for _ in 1 2 3 4 5 6; do
  c=$(bus_port)
  server "$c" --cluster-enabled yes --cluster-config-file "nodes-$c.conf" --cluster-node-timeout 2000
  nodes+=("127.0.0.1:$c")
done
for n in "${nodes[@]}"; do up "${n#*:}"; done
redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log"
for _ in $(seq 200); do
  ok=1
  for n in "${nodes[@]}"; do redis-cli -p "${n#*:}" CLUSTER INFO | grep -q 'cluster_state:ok' || ok=0; done
  [ "$ok" = 1 ] && break; sleep 0.1
done
for n in "${nodes[@]}"; do # the replicas' first sync
  redis-cli -p "${n#*:}" INFO replication | grep -q 'role:slave' && synced "${n#*:}"
done
run cluster "redis+cluster://$(IFS=,; echo "${nodes[*]}")"

# A primary, its replica and 3 sentinels.
sp=$(port); sr=$(port)
server "$sp"; up "$sp"
server "$sr" --replicaof 127.0.0.1 "$sp"; up "$sr"; synced "$sr"
sentinels=()
for _ in 1 2 3; do
  s=$(port)
  printf 'sentinel monitor bench 127.0.0.1 %s 2\n' "$sp" >"$dir/sentinel-$s.conf"
  redis-server "$dir/sentinel-$s.conf" --sentinel --port "$s" --bind 127.0.0.1 --dir "$dir" --logfile "$dir/$s.log" &
  tpids+=($!)
  sentinels+=("127.0.0.1:$s")
done
for s in "${sentinels[@]}"; do up "${s#*:}"; done
run sentinel "redis+sentinel://$(IFS=,; echo "${sentinels[*]}")/bench"
