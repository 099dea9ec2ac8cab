#!/usr/bin/env bash
# Instructions per acquire+release pair on the memory store (callgrind, examples/memory_instructions.rs):
# the per-key tokio semaphore, the store, and the Limiter, on one key and over 100,000 keys. Steady where
# the interleaved timing of examples/memory_ratio.rs moves with the machine's load.
#
#   scripts/bench/memory_instructions.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -q -p inflight --example memory_instructions
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
pairs=100000
echo "| per acquire+release pair | 1 key | 100,000 keys |"
echo "|---|---|---|"
for which in sem store limiter; do
  row="| $which |"
  for keys in 1 100000; do
    valgrind --tool=callgrind --toggle-collect='*measured*' --callgrind-out-file="$out/cg" \
      target/release/examples/memory_instructions "$which" "$keys" "$pairs" >/dev/null 2>&1
    total=$(sed -n 's/^summary: //p' "$out/cg")
    row="$row $((total / pairs)) |"
  done
  echo "$row"
done
