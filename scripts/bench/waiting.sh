#!/usr/bin/env bash
# Waiting for a slot across two processes (issue 31), for one or more builds side by side, on one fresh
# redis-server (127.0.0.1, a free port, stopped at the end):
#
#   scripts/bench/waiting.sh ROUNDS LABEL=DIR [LABEL=DIR ...]
#   # e.g. scripts/bench/waiting.sh 3 now=target/release before=/tmp/old/target/release
#
# DIR is a release target directory holding `inflight` and `examples/wait_load` (built with
# `cargo build --release -p inflight-server -p inflight --bin inflight --example wait_load`; an older
# commit needs this tree's crates/inflight/examples/wait_load/ copied in first). Each round runs, for
# each build in turn:
#   wait     `wait_load URL --procs 2`: 64 tasks (32 a process) on one key of limit 4, 3 s, then 200
#            release-to-admission trials across the two processes
#   wait1    `wait_load URL --procs 2 --limit 1 --trials 0`: the same 64 tasks on a key of limit 1
#   nowait   `wait_load URL --procs 2 --tasks 4 --limit 4 --trials 0`: as many slots, no one waits
#   bench    `inflight bench --store URL --tasks 64 --keys 1 --limit 1000000 --duration 3s`
# Redis's own CPU per admission (INFO cpu around the load) and its commands per admission (INFO
# commandstats, reset before each run). Prints one JSON line per run, then the tables in Markdown.
#
#   CALLGRIND=1 scripts/bench/waiting.sh 1 now=DIR before=DIR
# instead counts the instructions redis-server (under valgrind's callgrind) runs per admission for `wait`
# (with `--trials 0`) and `nowait`. Redis runs some 50 times slower there, so admissions/s fall and each
# waiter's once-a-second re-check weighs more per admission: a count for this shape, not a timeless one.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=$1
shift
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
out=$(mktemp -d)
server=(redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$out")
[ -z "${CALLGRIND:-}" ] || server=(valgrind --tool=callgrind --callgrind-out-file="$out/cg.%p" "${server[@]}")
"${server[@]}" >"$out/redis.log" 2>&1 &
redis=$!
trap 'kill "$redis" 2>/dev/null || true; wait 2>/dev/null; rm -rf "$out"' EXIT
for _ in $(seq 300); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.1; done
url="redis://127.0.0.1:$port"

if [ -n "${CALLGRIND:-}" ]; then
  echo "| build | load | admissions | instructions in redis-server per admission |"
  echo "|---|---|---|---|"
  for round in $(seq "$rounds"); do
    for build in "$@"; do
      label=${build%%=*} dir=${build#*=}
      for load in "wait --trials 0" "nowait --tasks 4 --trials 0"; do
        callgrind_control -z "$redis" >/dev/null
        line=$("$dir/examples/wait_load" "$url" --procs 2 ${load#* })
        callgrind_control -d "$redis" >/dev/null
        python3 - "$label" "${load%% *}" "$line" "$(ls -t "$out"/cg.* | head -1)" <<'PY'
import json, re, sys
label, load, line, dump = sys.argv[1:5]
n = json.loads(line)["admissions"]
count = int(re.search(r"^summary: (\d+)", open(dump).read(), re.M).group(1))
print(f"| {label} | {load} | {n:,} | {count / n:,.0f} |")
PY
      done
    done
  done
  exit 0
fi

# run LABEL LOAD ROUND COMMAND...: one JSON line, with the run's labels and commands per admission.
run() {
  local label=$1 load=$2 round=$3
  shift 3
  redis-cli -p "$port" CONFIG RESETSTAT >/dev/null
  local line
  line=$("$@" | tail -1)
  redis-cli -p "$port" INFO commandstats | tr -d '\r' >"$out/stats"
  python3 - "$label" "$load" "$round" "$line" "$out/stats" <<'PY'
import json, re, sys
label, load, round_, line, stats = sys.argv[1:6]
run = json.loads(line)
n = run.get("admissions") or run["pairs_per_sec"] * run["duration_s"]
calls = {m[1]: int(m[2]) for m in re.finditer(r"^cmdstat_(\w+):calls=(\d+)", open(stats).read(), re.M)}
run.update(build=label, load=load, round=int(round_),
           per_admission={c: round(k / n, 2) for c, k in sorted(calls.items()) if k / n >= 0.01})
print(json.dumps(run))
PY
}

for round in $(seq "$rounds"); do
  for build in "$@"; do
    label=${build%%=*} dir=${build#*=}
    run "$label" wait "$round" "$dir/examples/wait_load" "$url" --procs 2 >>"$out/runs.jsonl"
    run "$label" wait1 "$round" "$dir/examples/wait_load" "$url" --procs 2 --limit 1 --trials 0 >>"$out/runs.jsonl"
    run "$label" nowait "$round" "$dir/examples/wait_load" "$url" --procs 2 --tasks 4 --limit 4 --trials 0 >>"$out/runs.jsonl"
    run "$label" bench "$round" "$dir/inflight" bench --store "$url" --tasks 64 --keys 1 --limit 1000000 \
      --duration 3s --redis-prefix "w$round$label:" >>"$out/runs.jsonl"
  done
done
cat "$out/runs.jsonl"
python3 - "$out/runs.jsonl" <<'PY'
import json, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
builds = list(dict.fromkeys(r["build"] for r in runs))

def span(values, fmt="{:,.0f}"):
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}-{fmt.format(hi)}"

def of(build, load):
    return [r for r in runs if r["build"] == build and r["load"] == load]

print("\n| limit | build | admissions/s | wait p50 ms | p99 ms | max ms | share of process 1 / 2 | out of order | timed out |")
print("|---|---|---|---|---|---|---|---|---|")
for load, b in [(load, b) for load in ("wait", "wait1") for b in builds]:
    rs = of(b, load)
    share = " ; ".join(f"{r['share'][0]:.2f} / {r['share'][1]:.2f}" for r in rs)
    ooo = " ; ".join(f"{r['out_of_order'] / r['admissions']:.1%}" for r in rs)
    print(f"| {rs[0]['limit']} | {b} | {span([r['admissions_per_sec'] for r in rs])} | {span([r['wait']['p50_ms'] for r in rs], '{:.1f}')} | "
          f"{span([r['wait']['p99_ms'] for r in rs], '{:.1f}')} | {span([r['wait']['max_ms'] for r in rs], '{:.1f}')} | "
          f"{share} | {ooo} | {span([r['timed_out'] for r in rs])} |")
print("\n| build | wake across processes p50 ms | p99 ms | max ms |")
print("|---|---|---|---|")
for b in builds:
    rs = [r["wake_across"] for r in of(b, "wait")]
    print(f"| {b} | {span([w['p50_ms'] for w in rs], '{:.2f}')} | {span([w['p99_ms'] for w in rs], '{:.2f}')} | "
          f"{span([w['max_ms'] for w in rs], '{:.2f}')} |")
print("\n| build | load | admissions/s | Redis CPU per admission, µs | Redis commands per admission |")
print("|---|---|---|---|---|")
for b in builds:
    for load in ("wait", "wait1", "nowait", "bench"):
        rs = of(b, load)
        rate = [r.get("admissions_per_sec", r.get("pairs_per_sec")) for r in rs]
        cpu = [r.get("redis_cpu_us_per_admission", r.get("redis_cpu_us_per_pair")) for r in rs]
        calls = ", ".join(f"{c} {k:g}" for c, k in rs[-1]["per_admission"].items() if c not in ("info", "config"))
        print(f"| {b} | {load} | {span(rate)} | {span(cpu, '{:.1f}')} | {calls} |")
PY
