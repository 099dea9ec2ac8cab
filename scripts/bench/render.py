"""Renders the raw results of scripts/bench.sh into BENCHMARKS.md and docs/latency.svg.

Usage: python3 scripts/bench/render.py RAW_DIR REPO_ROOT (scripts/bench.sh calls it; KEEP=1 keeps RAW_DIR)."""
import json
import math
import pathlib
import re
import sys
import datetime

raw = pathlib.Path(sys.argv[1])
root = pathlib.Path(sys.argv[2])


def jsonl(name):
    path = raw / name
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def ns(value, unit):
    return float(value) * {"ps": 1e-3, "ns": 1.0, "µs": 1e3, "us": 1e3, "ms": 1e6, "s": 1e9}[unit]


def criterion():
    text = (raw / "criterion.txt").read_text()
    found = {}
    for name, mid, unit in re.findall(r"(acquire\+release/\S+)\s+time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]", text):
        found[name] = ns(mid, unit)
    return found


def store_name(store):
    return "memory" if store.startswith("memory") else "redis"


def wrk(name):
    path = raw / name
    if not path.exists():
        return None
    text = path.read_text()
    rps = re.search(r"Requests/sec:\s+([\d.]+)", text)
    p50 = re.search(r"^\s+50%\s+([\d.]+)(us|ms|s)", text, re.M)
    p99 = re.search(r"^\s+99%\s+([\d.]+)(us|ms|s)", text, re.M)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    total = re.search(r"(\d+) requests in", text)
    to_us = lambda m: float(m.group(1)) * {"us": 1, "ms": 1e3, "s": 1e6}[m.group(2)] if m else float("nan")
    return {
        "rps": float(rps.group(1)) if rps else float("nan"),
        "p50_us": to_us(p50),
        "p99_us": to_us(p99),
        "non_2xx": int(errors.group(1)) if errors else 0,
        "requests": int(total.group(1)) if total else 0,
    }


def cpu_per_request(name, requests):
    """(user, system) µs per request of the proxy and of Redis behind it, from a cpu-*.txt, or None."""
    path = raw / name
    if not path.exists() or not requests:
        return None
    tck, pu0, ps0, ru0, rs0, pu1, ps1, ru1, rs1 = (int(x) for x in path.read_text().split())
    us = lambda ticks: ticks / tck * 1e6 / requests
    out = {"proxy": (us(pu1 - pu0), us(ps1 - ps0)), "redis": (us(ru1 - ru0), us(rs1 - rs0))}
    switches = raw / name.replace("cpu-", "switches-", 1)
    if switches.exists():
        before, after = (int(x) for x in switches.read_text().split())
        out["switches"] = (after - before) / requests
    return out


def fmt(x, digits=0):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:,.{digits}f}"


lines = []
w = lines.append
today = datetime.date.today().isoformat()
w("# Benchmarks")
w("")
w("Every figure here was produced by one run of `scripts/bench.sh` (it also wrote this file), on the project's")
w(f"2-core machine, on {today}. Each alternative ran beside inflight in the same run; the machines are noisy, so")
w("compare ratios within a table rather than absolute numbers across runs. Client, servers and load generator")
w("share the same 2 cores. The last section reads the tables; where it says why, it names how that was seen.")
w("The sections after it, each on one issue, were measured by the commands they name and are kept as they are.")
w("")

# 1. memory vs semaphore
c = criterion()
w("## Memory store vs a per-key tokio semaphore")
w("")
w("One acquire+release pair on one thread, limit 64; on one key and cycling over 100,000 keys. The baseline is")
w("what a Rust user would otherwise write: `DashMap<String, Arc<tokio::sync::Semaphore>>`, `try_acquire_owned`, drop.")
w("First criterion (`cargo bench -p inflight --bench memory`):")
w("")
w("| one acquire+release | 1 key | vs semaphore | 100,000 keys | vs semaphore | pairs/s, 100,000 keys |")
w("|---|---|---|---|---|---|")
rows = [
    ("tokio semaphore per key (baseline)", "tokio_semaphore_per_key"),
    ("`MemoryStore` (the store)", "inflight_memory_store"),
    ("`Limiter::try_acquire` + drop the `Permit`", "inflight_limiter"),
]
for label, key in rows:
    one = c.get(f"acquire+release/{key}/1")
    many = c.get(f"acquire+release/{key}/100000")
    base1 = c.get("acquire+release/tokio_semaphore_per_key/1")
    basen = c.get("acquire+release/tokio_semaphore_per_key/100000")
    if one is None or many is None:
        continue
    w(f"| {label} | {one:.1f} ns | {one / base1:.2f}x | {many:.1f} ns | {many / basen:.2f}x | {1e9 / many / 1e6:.1f} M |")
w("")
# The same three, interleaved (examples/memory_ratio.rs): "keys contender ns ratio_median ratio_min ratio_max".
interleaved = {}
if (raw / "memory_ratio.txt").exists():
    for line in (raw / "memory_ratio.txt").read_text().splitlines():
        keys, name, *numbers = line.split()
        interleaved[(name, int(keys))] = [float(x) for x in numbers]
if interleaved:
    w("Criterion measures each for seconds in turn, so a burst of load from elsewhere on this shared machine can")
    w("land on one of them and skew the ratio. `examples/memory_ratio.rs` measures the ratio itself: the three")
    w("take turns in slices of the same number of pairs (about 10 ms), in rotating order, and each slice is")
    w("divided by the semaphore's slice of the same round; the median over the rounds, with the smallest and")
    w("largest round.")
    w("")
    w("| one acquire+release, interleaved | 1 key: ns | vs semaphore (range) | 100,000 keys: ns | vs semaphore (range) |")
    w("|---|---|---|---|---|")
    for label, key in rows:
        one, many = interleaved.get((key, 1)), interleaved.get((key, 100000))
        if one is None or many is None:
            continue
        cell = lambda r: f"{r[1]:.2f}x ({r[2]:.2f}-{r[3]:.2f})"
        w(f"| {label} | {one[0]:.1f} | {cell(one)} | {many[0]:.1f} | {cell(many)} |")
    w("")

# 2. redis vs naive
w("## Redis store vs a naive two-round-trip check-then-set")
w("")
w("acquire+release pairs/s and acquire latency, in one process, beside the reference system's way (HLEN, then")
w("HSET; HDEL to release) against the same `redis-server` in the same run (`examples/redis_load.rs`, both on one")
w("runtime thread, as `inflight bench` runs by default). The naive")
w("limiter over-admits under concurrency (defect D1); inflight never does (`tests/redis/processes.rs`).")
w("")
w((raw / "redis_load.md").read_text().strip())
w("")
unp = (raw / "ceiling_unpipelined.txt").read_text().strip() if (raw / "ceiling_unpipelined.txt").exists() else ""
pip = (raw / "ceiling_pipelined.txt").read_text().strip() if (raw / "ceiling_pipelined.txt").exists() else ""
num = lambda s: float(re.search(r"([\d.]+) requests per second", s).group(1)) if re.search(r"([\d.]+) requests per second", s) else float("nan")
w("The script-call ceiling of this Redis on this machine (`redis-benchmark -c 64 EVAL \"return 1\" 0`): "
  f"{fmt(num(unp))} calls/s one at a time, {fmt(num(pip))} calls/s pipelined 16 deep. inflight sends the admissions and")
w("releases that are waiting together in one script call (`batch.lua`), so under load it is not bound by that ceiling.")
w("")

# 3. concurrency
conc = jsonl("concurrency.jsonl")
w("## Latency vs concurrency (`inflight bench`)")
w("")
w("The library driven directly (no HTTP), one key, limit never reached: acquire latency and pairs/s as the")
w("number of concurrent tasks grows, on a runtime of one thread (`--threads 1`, the default), and at 64 tasks")
w("on two as well. `pipeline` is how many batches may be out to Redis at once (`--redis-pipeline`, 3 by")
w("default here and in the library; 64 tasks are also run with 1, the servers' default). `max seen` is the")
w("independent probe's largest in-flight count (with no hold, a task lowers the probe again before it next")
w("waits, so on one thread the probe never sees two permits at once).")
w("")
w("| store | tasks | threads | pipeline | pairs/s | p50 µs | p99 µs | max seen |")
w("|---|---|---|---|---|---|---|---|")


def pipeline_of(r):
    """Batches out to Redis at once: 3 (the library's default) for results from before the setting."""
    return r.get("redis_pipeline", 3)


# Rows without a thread count come from builds before `--threads` (one thread per core): shown as "?".
for r in sorted(conc, key=lambda r: (store_name(r["store"]) != "memory", r["tasks"], r.get("threads") or 0, -pipeline_of(r))):
    pipeline = "-" if store_name(r["store"]) == "memory" else pipeline_of(r)
    w(f"| {store_name(r['store'])} | {r['tasks']} | {r.get('threads', '?')} | {pipeline} | {fmt(r['pairs_per_sec'])} | {r['p50_us']:.1f} | {r['p99_us']:.1f} | {r['max_in_flight_seen']} |")
w("")
w("![acquire latency vs concurrent tasks](docs/latency.svg)")
w("")

# 3b. Redis's own CPU per pair, beside the reference system's traffic (issue 30's goals)
cpu_runs = jsonl("redis_cpu.jsonl")


def between(values, digits):
    lo, hi = min(values), max(values)
    return f"{lo:,.{digits}f}" if f"{lo:.{digits}f}" == f"{hi:.{digits}f}" else f"{lo:,.{digits}f}-{hi:,.{digits}f}"


if cpu_runs:
    w("## Redis CPU per admission")
    w("")
    w("Redis's own CPU time (`INFO cpu`, user + system, read before and after the run) per acquire+release")
    w("pair: a primary is one core, so this decides how far a deployment scales. `inflight bench --store")
    w("redis://... --tasks T --keys K --limit 1000000 --duration 4s` (`redis_cpu_us_per_pair` in its JSON line),")
    w("and beside it the reference system's traffic (`scripts/bench/reference.py PORT 4 4`: HLEN, HSET, HDEL, one")
    w("command at a time, from 4 processes); two rounds, the loads in turn, the range over the rounds.")
    w("")
    w("| load | pairs/s | p99 µs | Redis CPU per pair, µs | goal |")
    w("|---|---|---|---|---|")
    goals = {(64, 1): "≤ 2.5, ≥ 150,000 pairs/s, p99 ≤ 1 ms", (64, 64): "≤ 4", (1, 1): "≤ 25 and < half the reference's"}
    loads = [(64, 1), (64, 64), (1, 1)]
    others = [("the reference, 4 processes", ("reference", 4)), ("the reference, 1 process", ("reference", 1)),
              ("one PING at a time (a round trip's floor)", ("ping", 1))]
    for label, pick in [(f"{t} task{'s' if t > 1 else ''}, {k} key{'s' if k > 1 else ''}", (t, k)) for t, k in loads] + others:
        runs = [r for r in cpu_runs if (r.get("store"), r["tasks"]) == pick
                or (r.get("store") not in ("reference", "ping") and (r["tasks"], r["keys"]) == pick)]
        if not runs:
            continue
        pairs = between([r["pairs_per_sec"] for r in runs], 0)
        p99 = between([r["p99_us"] for r in runs], 0) if "p99_us" in runs[0] else "-"
        cpu = between([r["redis_cpu_us_per_pair"] for r in runs], 1)
        w(f"| {label} | {pairs} | {p99} | {cpu} | {goals.get(pick, '-')} |")
    w("")
instructions = raw / "redis_instructions.md"
if instructions.exists():
    w("Where that CPU goes, counted rather than timed: instructions inside `redis-server` per pair (callgrind,")
    w("user space only; `python3 scripts/bench/redis_instructions.py 100`), for the shapes of the loads above and")
    w("beside what any script call costs and the reference's three commands:")
    w("")
    lines.extend(instructions.read_text().rstrip("\n").split("\n"))
    w("")

# 4. scaling
for title, name, field, label in [
    ("Scaling with the number of keys", "keys.jsonl", "keys", "keys"),
    ("Scaling with permits held per key", "held.jsonl", "held", "held per key"),
]:
    rows = jsonl(name)
    w(f"## {title}")
    w("")
    w("Latency should stay flat." if field == "keys" else
      "Permits held on the key for the whole run (16 tasks acquiring and releasing beside them): latency should stay flat.")
    w("")
    w(f"| store | {label} | pairs/s | p50 µs | p99 µs |")
    w("|---|---|---|---|---|")
    for r in rows:
        w(f"| {store_name(r['store'])} | {r[field]:,} | {fmt(r['pairs_per_sec'])} | {r['p50_us']:.1f} | {r['p99_us']:.1f} |")
    w("")
    redis_held = {r["held"]: r for r in rows if field == "held" and store_name(r["store"]) == "redis"}
    if 1 in redis_held and 10000 in redis_held:
        one, many = redis_held[1], redis_held[10000]
        w("On Redis a key's leases are one sorted set: each admission and release is a ZADD or a ZREM on it, "
          f"O(log N); against one held permit, p50 {one['p50_us']:.0f} → {many['p50_us']:.0f} µs and "
          f"{fmt(one['pairs_per_sec'])} → {fmt(many['pairs_per_sec'])} pairs/s at 10,000.")
        w("")

# 4b. unlimited keys, and how soon an override reaches another process
unlimited = jsonl("unlimited.jsonl") if (raw / "unlimited.jsonl").exists() else []
if unlimited:
    w("## Unlimited keys, and how soon an override applies everywhere")
    w("")
    w("A key that no rule limits and that has no override is admitted from the process's view of the overrides,")
    w("with no round trip (`inflight bench --limit 0`, 64 tasks; Dify's default settings are all unlimited):")
    w("")
    w("| store | pairs/s | p50 µs | p99 µs |")
    w("|---|---|---|---|")
    for r in unlimited:
        w(f"| {store_name(r['store'])} | {fmt(r['pairs_per_sec'])} | {r['p50_us']:.2f} | {r['p99_us']:.2f} |")
    w("")
spread_path = raw / "override_spread.json"
if spread_path.exists():
    spread = json.loads(spread_path.read_text())
    a, u = spread["announced"], spread["unannounced"]
    w("`examples/override_spread.rs`: two stores on one Redis (two views, as two processes have); one sets an")
    w("override, and the time until the other's next admission of that key counts against it is measured. With")
    w("its announcement lost (written straight into Redis), only the version poll catches it: read every 50 ms, it")
    w("reads the index again once the announcement is still missing one read later.")
    w("")
    w("| override | trials | p50 ms | p99 ms | max ms |")
    w("|---|---|---|---|---|")
    w(f"| announced (pub/sub) | {a['trials']} | {a['p50_ms']:.2f} | {a['p99_ms']:.2f} | {a['max_ms']:.2f} |")
    w(f"| announcement lost (poll) | {u['trials']} | {u['p50_ms']:.1f} | {u['p99_ms']:.1f} | {u['max_ms']:.1f} |")
    w("")

# 4c. waiting for a slot
wait_path = raw / "wait.jsonl"
if wait_path.exists():
    waits = jsonl("wait.jsonl")
    w("## Waiting for a slot")
    w("")
    w("`examples/wait_load/`: 64 tasks loop on one key of limit 4, each waiting for a slot (`Limiter::acquire`,")
    w("up to 5 s), holding it 1 ms and releasing it; half the tasks on one limiter, half on another (two store")
    w("handles in one process; \"2 processes\": two OS processes, `wait_load URL --procs 2`). Then, 200 times,")
    w("one side releases the only slot while the other waits: the time from the release to the waiter's")
    w("admission (a wake-up across processes: Redis pub/sub).")
    w("")
    w("| store | admissions/s | wait p50 ms | wait p99 ms | wait max ms | wake across p50 ms | p99 ms | max ms |")
    w("|---|---|---|---|---|---|---|---|")
    for r in waits:
        wt, wk = r["wait"], r["wake_across"]
        store = r["store"] + (f", {r['processes']} processes" if "processes" in r else "")
        w(f"| {store} | {fmt(r['admissions_per_sec'])} | {wt['p50_ms']:.1f} | {wt['p99_ms']:.1f} | "
          f"{wt['max_ms']:.1f} | {wk['p50_ms']:.2f} | {wk['p99_ms']:.2f} | {wk['max_ms']:.2f} |")
    w("")

# 5. memory per permit
w("## Redis memory per held permit")
w("")
w("Real permits held through the library (`examples/redis_memory.rs`): `MEMORY USAGE` summed over every Redis key")
w("the store keeps for a user key holding N of them, divided by N. A lease is its id (a generated id is 17 bytes:")
w("0xFF and the UUID's 16) and its deadline, in one sorted set (`scripts/common.lua`); Redis keeps a set of up to")
w("128 members as a compact listpack, a larger one as a skiplist and a dict.")
w("")
memory_used = [tuple(int(x) for x in line.split())
               for line in (raw / "memory.txt").read_text().splitlines()]
w("| leases on the key | Redis keys | bytes | bytes per permit |")
w("|---|---|---|---|")
for n, used, keys in memory_used:
    w(f"| {n:,} | {keys:,} | {used:,} | {used / n:.1f} |")
w("")

# 6. proxy
w("## Proxy vs calling the upstream directly vs nginx `limit_conn`")
w("")
proxy_rounds = len({m.group(1) for f in raw.glob("wrk-nginx-_-*.txt") for m in [re.search(r"-(\d+)\.txt$", f.name)] if m})
w(f"`wrk -t2 -c64 -d3s`, {proxy_rounds} rounds, against the same upstream (nginx answering `ok`, or a 20-event `text/event-stream`), directly,")
w("through nginx with `limit_conn` on the key header, and through `inflight proxy` on the memory and the Redis")
w("store (limits high enough that nothing is refused). The upstream is an nginx of its own (one worker); the")
w("nginx proxy is another (one worker per core, Debian's default), so neither proxy shares a process with the")
w("upstream. (Earlier versions of this script ran one nginx worker as both proxy and upstream, which cut")
w("nginx's figures by a third or more.)")
w("")
w("The floor is `examples/hyper_floor.rs` in `inflight-server`: the parts the proxy is built on (hyper's HTTP/1")
w("server and client, one single-threaded runtime and `SO_REUSEPORT` socket per core, pooled keep-alive")
w("connections) forwarding requests and responses untouched, with no limiter, router, header rewriting or")
w("metrics. The proxy cannot beat it; the gap between the two is what inflight adds.")
w("")
w("The CPU column is the proxy's CPU time per request, user + system, read from `/proc` around each round")
w("(the median round's); behind the Redis proxy, Redis's own is added in brackets. `switches` is how often per")
w("request the proxy's threads blocked waiting for work (voluntary context switches, from `/proc`).")
w("")
w("| response | path | requests/s (median round) | vs nginx (each round) | p50 µs | p99 µs | CPU µs per request | non-2xx |")
w("|---|---|---|---|---|---|---|---|")
proxy_ratios = {}
proxy_cpu = {}
proxy_rps = {}
for path, label in [("_", "small"), ("_sse", "SSE, 20 events")]:
    rounds = sorted({int(m.group(1)) for f in raw.glob(f"wrk-nginx-{path}-*.txt")
                     for m in [re.search(r"-(\d+)\.txt$", f.name)] if m})
    nginx = {n: wrk(f"wrk-nginx-{path}-{n}.txt") for n in rounds}
    for target, name in [("direct", "direct to upstream"), ("nginx", "nginx limit_conn"),
                         ("hyper-floor", "hyper alone: the floor"),
                         ("inflight-memory", "inflight proxy, memory"),
                         ("inflight-memory-batch", "inflight proxy, memory, `chrt --batch 0`"),
                         ("inflight-redis", "inflight proxy, Redis"),
                         ("inflight-redis-p3", "inflight proxy, Redis, `--redis-pipeline 3`")]:
        runs = {n: wrk(f"wrk-{target}-{path}-{n}.txt") for n in rounds}
        runs = {n: r for n, r in runs.items() if r is not None}
        if not runs:
            continue
        proxy_rps[(target, path)] = {n: r["rps"] for n, r in runs.items()}
        ratios = sorted(r["rps"] / nginx[n]["rps"] for n, r in runs.items() if nginx.get(n) and nginx[n]["rps"])
        proxy_ratios[(target, path)] = ratios
        median_round = sorted(runs, key=lambda n: runs[n]["rps"])[len(runs) // 2]
        median = runs[median_round]
        spread = (f"{ratios[0]:.2f}" if f"{ratios[0]:.2f}" == f"{ratios[-1]:.2f}" else f"{ratios[0]:.2f}-{ratios[-1]:.2f}") if ratios else "n/a"
        cpu = cpu_per_request(f"cpu-{target}-{path}-{median_round}.txt", median["requests"])
        proxy_cpu[(target, path)] = cpu
        cpu_text = "-"
        if cpu:
            cpu_text = f"{cpu['proxy'][0]:.1f} + {cpu['proxy'][1]:.1f}"
            if "switches" in cpu:
                cpu_text += f", {cpu['switches']:.2f} switches"
            if target.startswith("inflight-redis"):
                cpu_text += f" (Redis {cpu['redis'][0]:.1f} + {cpu['redis'][1]:.1f})"
        w(f"| {label} | {name} | {fmt(median['rps'])} | {spread} | {fmt(median['p50_us'])} | {fmt(median['p99_us'])} | {cpu_text} | {sum(r['non_2xx'] for r in runs.values())} |")
w("")
# 5b. instructions per proxied request (scripts/instructions.sh)
counted = {}
if (raw / "instructions.txt").exists():
    for line in (raw / "instructions.txt").read_text().splitlines():
        m = re.match(r"(\S+) \S+: (\d+) requests, (\d+) instructions per request", line)
        if m:
            counted[m.group(1)] = int(m.group(3))
if counted:
    w("## Instructions per proxied request")
    w("")
    w("User-space instructions per proxied request, counted by callgrind with one worker (`scripts/instructions.sh`;")
    w("steady to under 1 % between runs where requests/s is not): inflight's memory proxy with its access line")
    w("written (the default) and without it (`--access-log false`), on a Redis store (the proxy alone), hyper")
    w("forwarding and nothing else (the floor), and nginx with `limit_conn`.")
    w("")
    w("| proxy | instructions per request | over the floor | goal |")
    w("|---|---|---|---|")
    floor = counted.get("hyper-floor")
    goals = {"inflight-memory": "within 5,000 of the floor", "inflight-memory-no-access-log": "within 3,000"}
    for name in ["inflight-memory", "inflight-memory-no-access-log", "inflight-redis", "hyper-floor", "nginx"]:
        if name in counted:
            over = f"{counted[name] - floor:+,}" if floor and name != "hyper-floor" else "-"
            w(f"| {name} | {counted[name]:,} | {over} | {goals.get(name, '-')} |")
    w("")
w("## What the figures say")
w("")


def ratio(key, keys):
    one, base = c.get(f"acquire+release/{key}/{keys}"), c.get(f"acquire+release/tokio_semaphore_per_key/{keys}")
    return one / base if one and base else float("nan")


def load_row(tasks):
    for line in (raw / "redis_load.md").read_text().splitlines():
        cells = [x.strip() for x in line.strip("|").split("|")]
        if cells and cells[0] == str(tasks):
            return {"pairs": float(cells[1]), "p99_us": float(cells[3])}
    return None


def conc_row(store, tasks, threads=1, pipeline=3):
    return next((r for r in conc if store_name(r["store"]) == store and r["tasks"] == tasks
                 and r.get("threads") == threads and pipeline_of(r) == pipeline), None)


def redis_us_per_op():
    path, row = raw / "commandstats-64.txt", conc_row("redis", 64)
    if not path.exists() or row is None:
        return float("nan")
    m = re.search(r"cmdstat_evalsha:calls=\d+,usec=(\d+)", path.read_text())
    ops = 2 * row["pairs_per_sec"] * row["duration_s"]
    return int(m.group(1)) / ops if m and ops else float("nan")


def span(values, digits=2):
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "n/a"
    lo, hi = min(values), max(values)
    return f"{lo:.{digits}f}x" if f"{lo:.{digits}f}" == f"{hi:.{digits}f}" else f"{lo:.{digits}f}-{hi:.{digits}f}x"


memory_rows = {n: used / n for n, used, _ in memory_used}
load64, bench64, bench256 = load_row(64), conc_row("redis", 64), conc_row("redis", 256)
w(f"- **Memory store.** The store itself costs {span([ratio('inflight_memory_store', 1), ratio('inflight_memory_store', 100000)])} of the per-key semaphore (a permit of")
w("  this process holds its key's cell, with no id entry, deadline or renewal). The whole `Limiter::try_acquire`")
w(f"  path, awaited as a handler awaits it, costs {ratio('inflight_limiter', 1):.2f}x on one hot key and {ratio('inflight_limiter', 100000):.2f}x over 100,000 keys")
lim1, limn = interleaved.get(("inflight_limiter", 1)), interleaved.get(("inflight_limiter", 100000))
if lim1 and limn:
    w(f"  in criterion, and {lim1[1]:.2f}x and {limn[1]:.2f}x interleaved (the median round, which a burst of load")
    w("  elsewhere moves less than it moves criterion's ratio):")
    worst = max(lim1[1], limn[1])
else:
    w("  in criterion:")
    worst = max(ratio("inflight_limiter", 1), ratio("inflight_limiter", 100000))
w("  " + ("inside the 1.5x goal." if worst <= 1.5 else "over the 1.5x goal in this run.")
  + " In `inflight bench` on two threads, 64 tasks hit one key's counter from both cores:")
mem1, mem2 = conc_row("memory", 64), conc_row("memory", 64, 2)
w(f"  {fmt(mem2['pairs_per_sec'] if mem2 else float('nan'))} pairs/s, against {fmt(mem1['pairs_per_sec'] if mem1 else float('nan'))} on one thread.")
w("- **Redis store.** The admissions and releases that are waiting ride together in one `batch.lua` call. A batch")
w("  names each key once, reads the operations' shared terms once, and answers in one flat array of numbers, so")
w("  a hot key costs one ZADD per admission and one ZREM per release plus a handful of calls per batch:")
w(f"  {redis_us_per_op():.1f} µs of Redis time per operation at 64 tasks (its `INFO commandstats`, read by the script).")
pairs64 = [load64["pairs"] if load64 else float("nan"), bench64["pairs_per_sec"] if bench64 else float("nan")]
p99s64 = [load64["p99_us"] if load64 else float("nan"), bench64["p99_us"] if bench64 else float("nan")]
w(f"  At 64 tasks it makes {fmt(pairs64[0])} and {fmt(pairs64[1])} pairs/s in the two tables, with p99 {fmt(p99s64[0])} and")
met = sum(1 for pairs, p99 in zip(pairs64, p99s64) if pairs >= 100_000 and p99 <= 1000)
w(f"  {fmt(p99s64[1])} µs; the goal is 100,000 with p99 under 1 ms, met in {met} of the 2 tables in this run.")
two = conc_row("redis", 64, 2)
w("  Both run the load (and, in the naive table, both limiters) on one runtime thread.")
if two and bench64:
    fewer = two["pairs_per_sec"] < bench64["pairs_per_sec"]
    w(f"  On two threads, the same load made {fmt(two['pairs_per_sec'])} pairs/s (p99 {fmt(two['p99_us'])} µs), "
      + ("fewer than on one." if fewer else "more than on one in this run."))
w(f"  At 256 tasks: {fmt(bench256['pairs_per_sec'] if bench256 else float('nan'))}. Client, Redis and load share 2 cores.")
w("  Spreading the load over many keys costs more calls per operation (less is shared within a batch).")
worst_bytes = max(memory_rows.values()) if memory_rows else float("nan")
w(f"- **Memory per permit.** {min(memory_rows.values()):.0f}-{worst_bytes:.0f} bytes per held permit from 100 to 100,000 leases on a key"
  + f" ({memory_rows.get(100000, float('nan')) * 100000 / 1e6:.0f} MB for 100,000 held permits).")
mem_r = proxy_ratios.get(("inflight-memory", "_"), []) + proxy_ratios.get(("inflight-memory", "_sse"), [])
red_r = proxy_ratios.get(("inflight-redis", "_"), []) + proxy_ratios.get(("inflight-redis", "_sse"), [])
def cpu_of(target, part, path="_"):
    cpu = proxy_cpu.get((target, path))
    return cpu[part] if cpu else (float("nan"), float("nan"))


ng_u, ng_s = cpu_of("nginx", "proxy")
me_u, me_s = cpu_of("inflight-memory", "proxy")
re_u, re_s = cpu_of("inflight-redis", "proxy")
rd_u, rd_s = cpu_of("inflight-redis", "redis")
def met(ratios, goal):
    return f"at or above it in {sum(r >= goal for r in ratios)} of {len(ratios)} rounds"


w(f"- **Proxy.** {span(mem_r)} of nginx's requests/s on the memory store (goal 1x, {met(mem_r, 1.0)}) and {span(red_r)}")
w(f"  on Redis (goal 0.6x, {met(red_r, 0.6)}), over the rounds and both responses above. Load generator, upstream and proxy share")
w("  the machine's cores, so CPU a proxy spends per request is CPU the others do not get. For a small response")
w("  nginx spends")
w(f"  {ng_u:.1f} µs in user space and {ng_s:.1f} in the kernel; inflight on the memory store {me_u:.1f} and {me_s:.1f}.")
where = ("user space" if (me_u - ng_u) >= (me_s - ng_s) else "the kernel") \
    if all(map(math.isfinite, (me_u, ng_u, me_s, ng_s))) else "(not measured in this run)"
w(f"  Most of the difference is in {where}: inflight's is hyper's HTTP/1 server and client, the limiter, the")
w("  header rewriting and the metrics. `scripts/instructions.sh` counts instructions per request (callgrind) for")
w("  nginx, hyper alone and inflight.")
fl_r = proxy_ratios.get(("hyper-floor", "_"), [])
fl_u, fl_s = cpu_of("hyper-floor", "proxy")
w(f"  The floor, hyper alone, reached {span(fl_r)} of nginx's requests/s for the small response, spending {fl_u:.1f} µs")
w(f"  per request in user space and {fl_s:.1f} in the kernel: of inflight's {me_u - ng_u:.1f} µs more user time than nginx's,")
w(f"  {fl_u - ng_u:.1f} is the HTTP stack's and {me_u - fl_u:.1f} inflight's own. inflight answers on one thread per core, each with its own")
w("  runtime, listening socket, limiter and pool of upstream connections; on the memory store a request never")
w("  leaves its thread, and on Redis each worker batches its own admissions and releases over its own connection.")
ms_u, ms_s = cpu_of("inflight-memory", "proxy", "_sse")
ns_u, ns_s = cpu_of("nginx", "proxy", "_sse")
def switches_of(target, path):
    cpu = proxy_cpu.get((target, path))
    return cpu.get("switches", float("nan")) if cpu else float("nan")


w(f"  The 20-event response costs inflight {ms_u + ms_s:.1f} µs per request against {me_u + me_s:.1f} for the small one;")
w(f"  nginx {ns_u + ns_s:.1f} against {ng_u + ng_s:.1f}. inflight's threads blocked {switches_of('inflight-memory', '_sse'):.2f} times per request there")
w(f"  and {switches_of('inflight-memory', '_'):.2f} for the small one; nginx's {switches_of('nginx', '_sse'):.2f} and {switches_of('nginx', '_'):.2f} (median rounds).")
w(f"  On Redis the proxy spends {re_u:.1f} + {re_s:.1f} µs per request and Redis {rd_u:.1f} + {rd_s:.1f} more, for one")
w("  admission and one release, each sent to Redis in a batch with others and decided in Lua.")


def gain(ours, other, path):
    """(median of the per-round requests/s ratios ours / other, rounds ours was ahead, rounds): two proxies
    of the table side by side."""
    a, b = proxy_rps.get((ours, path), {}), proxy_rps.get((other, path), {})
    pairs = [(a[n], b[n]) for n in a if n in b and b[n]]
    if not pairs:
        return float("nan"), 0, 0
    ratios = sorted(x / y for x, y in pairs)
    return ratios[len(ratios) // 2], sum(x > y for x, y in pairs), len(pairs)


sse_b, sse_b_ahead, sse_b_n = gain("inflight-memory-batch", "inflight-memory", "_sse")
small_b, small_b_ahead, small_b_n = gain("inflight-memory-batch", "inflight-memory", "_")
w(f"  Under `chrt --batch 0` (Linux's SCHED_BATCH: a worker woken by its socket does not preempt the upstream or")
w(f"  the load generator) the memory proxy made {sse_b:.2f}x its requests/s on the default policy on the event")
w(f"  stream (median round; ahead in {sse_b_ahead} of {sse_b_n}) and {small_b:.2f}x on small responses ({small_b_ahead} of {small_b_n}).")


def pipeline_gain(path):
    """One batch out at a time against three, for the Redis proxy."""
    return gain("inflight-redis", "inflight-redis-p3", path)


p3_u, p3_s = cpu_of("inflight-redis-p3", "redis")
one_gain, one_ahead, one_n = pipeline_gain("_")
sse1_gain, sse1_ahead, sse1_n = pipeline_gain("_sse")
b3, b1 = conc_row("redis", 64), conc_row("redis", 64, 1, 1)
w("- **Redis pipeline.** How many batches may be out to Redis at once (from each of the proxy's workers, which batch")
w("  their own) trades round trips against script calls.")
w(f"  Behind the proxy, one at a time (the servers' default) made {one_gain:.2f}x the requests/s of three (the library's")
w(f"  default) on small responses (median round; ahead in {one_ahead} of {one_n} rounds) and {sse1_gain:.2f}x on the event")
w(f"  stream ({sse1_ahead} of {sse1_n}), with Redis spending {rd_u + rd_s:.1f} µs per small request against {p3_u + p3_s:.1f}: the")
w("  operations that arrive while a batch is out wait and leave together, and the CPU Redis is spared goes to")
w("  the proxy, the upstream and the clients on the same cores. A loop of tasks that only wait on Redis wants the")
w(f"  opposite: `inflight bench --tasks 64` made {fmt(b3['pairs_per_sec'] if b3 else float('nan'))} pairs/s with three and")
w(f"  {fmt(b1['pairs_per_sec'] if b1 else float('nan'))} with one, since with one Redis idles while each answer travels and the next batch forms.")
w("")
# 7. Redis topologies and --redis-wait-replicas (scripts/bench/topologies.sh)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import topologies  # noqa: E402

for line in topologies.section(raw):
    w(line)

w("## Reproduce")
w("")
w("```sh")
w("scripts/bench.sh                  # all of the above; installs redis-server, nginx and wrk when missing")
w("cargo bench -p inflight --bench memory")
w("cargo run --release -p inflight --example memory_ratio   # the same, interleaved")
w("scripts/bench-redis.sh 3          # the Redis table alone")
w("scripts/bench/topologies.sh DIR   # the topologies table alone (DIR/topologies.jsonl)")
w("scripts/instructions.sh           # instructions per proxied request (callgrind), inflight and the floor")
w("python3 scripts/bench/redis_instructions.py 100   # instructions inside redis-server per pair (callgrind)")
w("scripts/bench/memory_instructions.sh                # instructions per pair on the memory store (callgrind)")
w("python3 scripts/bench/redis_instructions.py parts   # where a busy key's pair goes inside redis-server")
w("python3 scripts/bench/reference.py PORT 4 4       # the reference's HLEN, HSET, HDEL from 4 processes")
w("inflight bench --store redis://127.0.0.1:6379 --tasks 64 --duration 5s   # one JSON line")
w("```")
# Sections this script does not render (measured by the commands they name, for one issue) are kept as
# they were, before "Reproduce".
old = (root / "BENCHMARKS.md").read_text() if (root / "BENCHMARKS.md").exists() else ""
rendered = {line for line in lines if line.startswith("## ")}
kept = [part for part in re.split(r"(?m)^(?=## )", old)[1:] if part.splitlines()[0] not in rendered]
at = lines.index("## Reproduce")
lines[at:at] = [line for part in kept for line in part.rstrip("\n").split("\n") + [""]]
(root / "BENCHMARKS.md").write_text("\n".join(lines) + "\n")

# The plot: p50 and p99 vs tasks, per store, log scale.
series = {}
# One thread (the default); raw results from before `--threads` have no such rows, and plot what they have.
plotted = [r for r in conc if r.get("threads") == 1 and pipeline_of(r) == 3] or [r for r in conc if "threads" not in r]
for r in plotted:
    for q in ("p50_us", "p99_us"):
        series.setdefault(f"{store_name(r['store'])} {q[:3]}", []).append((r["tasks"], max(r[q], 0.01)))
W, H, L, R, T, B = 640, 400, 70, 170, 30, 50
xs = sorted({t for pts in series.values() for t, _ in pts})
ys = [v for pts in series.values() for _, v in pts]
lo, hi = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))
hi = max(hi, lo + 1)
px = lambda t: L + (W - L - R) * (xs.index(t) / max(len(xs) - 1, 1))
py = lambda v: T + (H - T - B) * (1 - (math.log10(v) - lo) / (hi - lo))
colors = {"memory p50": "#1f77b4", "memory p99": "#6baed6", "redis p50": "#d62728", "redis p99": "#fc9272"}
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<text x="{L}" y="18" font-size="14">inflight acquire latency vs concurrent tasks ({today})</text>']
for e in range(lo, hi + 1):
    y = py(10 ** e)
    svg.append(f'<line x1="{L}" y1="{y:.1f}" x2="{W - R}" y2="{y:.1f}" stroke="#ddd"/>')
    svg.append(f'<text x="{L - 8}" y="{y + 4:.1f}" text-anchor="end">{10 ** e:g} µs</text>')
for t in xs:
    svg.append(f'<text x="{px(t):.1f}" y="{H - B + 18}" text-anchor="middle">{t}</text>')
svg.append(f'<text x="{(L + W - R) / 2:.1f}" y="{H - 12}" text-anchor="middle">concurrent tasks</text>')
for i, (name, pts) in enumerate(sorted(series.items())):
    color = colors.get(name, "#333")
    path = " ".join(f"{px(t):.1f},{py(v):.1f}" for t, v in sorted(pts))
    dash = ' stroke-dasharray="5,3"' if "p99" in name else ""
    svg.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
    for t, v in pts:
        svg.append(f'<circle cx="{px(t):.1f}" cy="{py(v):.1f}" r="3" fill="{color}"/>')
    svg.append(f'<line x1="{W - R + 15}" y1="{T + 20 + i * 20}" x2="{W - R + 40}" y2="{T + 20 + i * 20}" stroke="{color}" stroke-width="2"{dash}/>')
    svg.append(f'<text x="{W - R + 46}" y="{T + 24 + i * 20}">{name}</text>')
svg.append("</svg>")
(root / "docs").mkdir(exist_ok=True)
(root / "docs" / "latency.svg").write_text("\n".join(svg) + "\n")

