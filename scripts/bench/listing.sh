#!/usr/bin/env bash
# Admission latency over HTTP, idle and beside 64 clients listing the busy keys (`GET /v1/keys?limit=1000`),
# on the memory store and on a redis-server of its own (issue 32). One JSON line per store and phase.
#
#   scripts/bench/listing.sh                         # builds the release binary and uses it
#   scripts/bench/listing.sh path/to/inflight        # another build (e.g. an older one, for before/after)
#   BUSY=5000 LISTERS=64 ADMITTERS=8 DURATION=5 scripts/bench/listing.sh
#   NO_BACKOFF=1 scripts/bench/listing.sh           # refused listers ask again at once (no Retry-After)
#   LIST=holders HOLDERS=1000 scripts/bench/listing.sh   # the listers walk one key's holders (issue 41)
#   LIST=holders SAME_KEY=1 scripts/bench/listing.sh     # ... and the admitters admit on that key
#
# The server has two workers (one per core here) and one permit held on each of $BUSY keys (with
# LIST=holders: $HOLDERS labelled permits on the key `hot`); see scripts/bench/listing.py for the load.
# Everything listens on 127.0.0.1 only.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/bench/lib.sh
install_missing redis-server=redis-server,redis-tools

if [ $# -ge 1 ]; then
  bin=$1
else
  cargo build --release -q -p inflight-server --bin inflight
  bin=target/release/inflight
fi
out=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$out"
}
trap cleanup EXIT
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "nothing listens on $1" >&2; return 1; }

redis_port=$(port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$out" >"$out/redis.log" 2>&1 &
pids+=($!)
wait_port "$redis_port"

for store in memory:// "redis://127.0.0.1:$redis_port"; do
  api=$(port)
  INFLIGHT_LOG=warn "$bin" serve --listen "127.0.0.1:$api" --workers 2 --default-limit 1000 \
    --store "$store" --redis-prefix "listing-$api:" &
  server=$!
  pids+=($server)
  wait_port "$api"
  python3 scripts/bench/listing.py "http://127.0.0.1:$api" --label "${store%%:*}" \
    --busy "${BUSY:-5000}" --listers "${LISTERS:-64}" --admitters "${ADMITTERS:-8}" --duration "${DURATION:-5}" ${NO_BACKOFF:+--no-backoff} \
    --list "${LIST:-keys}" --holders "${HOLDERS:-1000}" ${SAME_KEY:+--same-key}
  kill "$server"
  wait "$server" 2>/dev/null || true
done
