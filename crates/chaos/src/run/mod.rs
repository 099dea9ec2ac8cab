//! `inflight-chaos run`: each scenario on a topology of its own, with holder processes writing histories,
//! its fault injected a third of the way in, a status line per key once every lease could have ended,
//! then the histories checked (inflight-history, in process); one JSON line per scenario.

mod check;
mod relay;
mod scenarios;
mod topology;
mod upstream;
mod waiting;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use inflight::{Limiter, RedisStore};
use inflight_history::{ReadError, Report};
use serde_json::{json, Value};

use self::relay::Relay;
use self::scenarios::{Bound, Fault, Scenario, Stage};
use self::topology::{default_inflight, start_inflight, Kind, Proc, Topology};
use self::waiting::{Tickets, Waits};
use crate::history::History;
use crate::holder::keys_of;

/// What `run` is told.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct RunArgs {
    /// Fewer scenarios, fewer holders, shorter runs (under 5 minutes on 2 cores).
    #[arg(long)]
    pub(crate) quick: bool,
    /// Only the scenarios whose name contains this.
    #[arg(long)]
    pub(crate) only: Option<String>,
    /// The `inflight` binary (serve, proxy); default: beside this one.
    #[arg(long)]
    pub(crate) inflight: Option<PathBuf>,
    /// A Python with `inflight_client` installed, for Python holders (none without it).
    #[arg(long)]
    pub(crate) python: Option<PathBuf>,
    /// The Python holder script.
    #[arg(long, default_value = "clients/python/chaos_holder.py")]
    pub(crate) python_holder: PathBuf,
    /// Where each scenario's histories and logs go (a directory per scenario).
    #[arg(long, default_value = "target/chaos")]
    pub(crate) out: PathBuf,
}

/// The lease of every permit of a run.
const LEASE_MS: u64 = 2_000;
/// The tasks of each holder.
const TASKS: usize = 4;

/// How big and long a scenario's run is.
#[derive(Debug, Clone)]
struct Plan {
    duration_ms: u64,
    fault_at_ms: u64,
    /// How many holders of each kind.
    holders: Vec<(&'static str, usize)>,
    /// The holders' mix of keys, and how long the library's may wait for a slot (0: they do not).
    mix: &'static str,
    max_wait_ms: u64,
}

fn plan(args: &RunArgs, scenario: &Scenario) -> Plan {
    let (duration_ms, rust) = if args.quick { (8_000, 3) } else { (20_000, 6) };
    if scenario.fault == Fault::Waiters {
        // Library waiters only: one killed, one paused, one cut, two left alone. Long enough after the
        // faults (3.5 s from a quarter in) for the paused and cut ones to be admitted again: at least
        // two waits that run out (4 s each, most asks queue behind 15 others) and a reconnection (8.5 s
        // at 16 s; with 4.5 s, a waiter on a loaded machine was now and then refused twice and counted
        // as stalled).
        let duration_ms = duration_ms.max(16_000);
        return Plan {
            duration_ms,
            fault_at_ms: duration_ms / 4,
            holders: vec![("rust", 5)],
            mix: "wait",
            max_wait_ms: 4_000,
        };
    }
    // Python's holders take a redis:// or redis+sentinel:// URL (RedisLimiter runs no Cluster).
    let python = usize::from(scenario.topology != Kind::Cluster && args.python.is_some()) * 2;
    let proxy = usize::from(scenario.fault == Fault::ProxyStorm) * 2 + 1;
    Plan {
        duration_ms,
        fault_at_ms: duration_ms / 3,
        holders: vec![
            ("rust", rust),
            ("py", python),
            ("http", 2),
            ("proxy", proxy),
        ],
        mix: "multi",
        max_wait_ms: 0,
    }
}

/// Runs the scenarios asked for; true when every one stayed within its bound.
pub(crate) fn run(args: RunArgs) -> crate::Result<bool> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let inflight = args.inflight.clone().unwrap_or_else(default_inflight);
    let mut all_ok = true;
    for scenario in scenarios::all() {
        let wanted = match &args.only {
            Some(only) => scenario.name.contains(only.as_str()),
            None => scenario.quick || !args.quick,
        };
        if !wanted {
            continue;
        }
        let started = Instant::now();
        let dir = args.out.join(scenario.name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let (files, tickets) = run_one(&args, &runtime, &scenario, &inflight, &dir)?;
        let verdict = inflight_history::check_files(&files);
        let waits = tickets.map(|tickets| Waits::read(&files, &[scenarios::KILLED], tickets));
        let ok = verdict.as_ref().ok().map(|report| {
            judge(scenario.bound, report) && waits.as_ref().is_none_or(Waits::within)
        });
        all_ok &= ok == Some(true);
        let line = report(&scenario, (&verdict, waits.as_ref()), ok, started, &dir);
        println!("{line}");
    }
    Ok(all_ok)
}

/// Runs one scenario; its history files, and for a run of waiters the tickets left in the queues.
fn run_one(
    args: &RunArgs,
    runtime: &tokio::runtime::Runtime,
    scenario: &Scenario,
    inflight: &std::path::Path,
    dir: &std::path::Path,
) -> crate::Result<(Vec<PathBuf>, Option<Tickets>)> {
    let plan = plan(args, scenario);
    let topology = Topology::start(scenario.topology);
    let relay = match (scenario.relay, topology.port()) {
        (true, Some(port)) => Some(runtime.block_on(Relay::start(port))?),
        _ => None,
    };
    // The store of a process: through the relay where the scenario sends it there.
    let store_of = |process: &str| match &relay {
        Some(relay) if scenarios::relayed(scenario.fault, process) => {
            format!("redis://127.0.0.1:{}", relay.port)
        }
        _ => topology.url(),
    };
    let store = store_of("serve");
    let runner = History::open(&dir.join("runner.jsonl"), "runner")?;
    let (serve, serve_addr) = start_inflight(inflight, "serve", &store, LEASE_MS, &[], dir)?;
    let upstream = format!("127.0.0.1:{}", runtime.block_on(upstream::start())?);
    let proxy_flags = [
        "--forward-token".to_owned(),
        "--upstream".to_owned(),
        format!("http://{upstream}"),
        "--admin-listen".to_owned(),
        format!("127.0.0.1:{}", test_support::procs::free_ports(1)[0]),
    ];
    let (proxy, proxy_addr) =
        start_inflight(inflight, "proxy", &store, LEASE_MS, &proxy_flags, dir)?;
    let exe = std::env::current_exe()?;
    let spawn = |kind: &str, n: usize, duration_ms: u64, storm: bool| -> Proc {
        let process = format!("{}-{n}", if storm { "storm" } else { kind });
        let mut command = if kind == "py" {
            let mut c = Command::new(args.python.as_ref().expect("a python"));
            c.arg(&args.python_holder);
            c
        } else {
            let mut c = Command::new(&exe);
            c.args(["holder", "--kind", kind]);
            if scenario.bound == Bound::MustExceed {
                c.arg("--loose");
            }
            c
        };
        let target = match kind {
            "http" => format!("http://{serve_addr}"),
            "proxy" => format!("http://{proxy_addr}"),
            _ => store_of(&process),
        };
        let seed = n as u64 + 1 + 1000 * u64::from(storm);
        command
            .args(["--target", &target])
            .args(["--upstream", &upstream])
            .args(["--process", &process])
            .arg("--out")
            .arg(dir.join(format!("{process}.jsonl")))
            .args(["--duration-ms", &duration_ms.to_string()])
            .args(["--lease-ms", &LEASE_MS.to_string()])
            .args(["--tasks", &TASKS.to_string()])
            .args(["--mix", plan.mix])
            .args(["--seed", &seed.to_string()]);
        if storm {
            command.arg("--storm");
        }
        // (Only the library's holders wait: Python's holder has no such flag.)
        if plan.max_wait_ms > 0 {
            command.args(["--max-wait-ms", &plan.max_wait_ms.to_string()]);
        }
        Proc::spawn(&process, command, &dir.join(format!("{process}.log"))).expect("start a holder")
    };
    let mut holders = Vec::new();
    for &(kind, count) in &plan.holders {
        holders.extend((0..count).map(|n| spawn(kind, n, plan.duration_ms, false)));
    }
    let started = Instant::now();
    std::thread::sleep(Duration::from_millis(plan.fault_at_ms));
    let storm = |n: usize, duration_ms: u64| -> Vec<Proc> {
        (0..n)
            .map(|i| spawn("proxy", i, duration_ms, true))
            .collect()
    };
    let stage = Stage {
        topology: &topology,
        relay: relay.as_deref(),
        holders: &holders,
        lease_ms: LEASE_MS,
        storm: &storm,
    };
    let (from, to) = scenarios::inject(scenario.fault, &stage, &runner);
    runner.fault(scenario.name, from, to);
    // Every holder ends by itself (a killed one already has); a stopped one is continued by now.
    let deadline = started + Duration::from_millis(plan.duration_ms) + Duration::from_secs(30);
    for holder in &mut holders {
        holder.wait_until(deadline);
    }
    for victim in scenarios::killed(scenario.fault, &holders) {
        let file = dir.join(format!("{}.jsonl", victim.name));
        crate::history::end_killed(&file, from)?;
    }
    drop((serve, proxy));
    let waiters = plan.max_wait_ms > 0;
    let port = topology.port().filter(|_| waiters);
    let at_end = port.and_then(waiting::tickets);
    // Every lease could have ended (and every ticket, where holders waited): what is still counted is
    // leaked.
    let ticket_ms = inflight::TICKET_LEASE_MS * u64::from(waiters);
    std::thread::sleep(Duration::from_millis(LEASE_MS.max(ticket_ms) + 500));
    runtime.block_on(statuses(&topology.url(), &runner));
    let tickets = port.map(|port| {
        runtime.block_on(waiting::probe(&topology.url(), &runner, LEASE_MS));
        let left = waiting::tickets(port);
        Tickets { at_end, left }
    });
    drop(holders);
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    Ok((files, tickets))
}

/// A limiter on `url` with the run's policy, for the runner's own operations.
fn limiter(url: &str) -> Option<Limiter<RedisStore>> {
    let store = RedisStore::open(url).ok()?;
    Some(
        Limiter::builder(store)
            .policy(crate::holder::policy(false))
            .build(),
    )
}

/// A status line per key of the run, read on `url`.
async fn statuses(url: &str, runner: &History) {
    let Some(limiter) = limiter(url) else {
        return;
    };
    for key in keys_of("multi") {
        for _ in 0..20 {
            let invoke = runner.now();
            if let Ok(status) = limiter.status(&key).await {
                runner.status(&key, status.in_flight, (invoke, runner.now()));
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// Whether the report is within `bound`. Leaks and tokens going backwards are over every bound.
fn judge(bound: Bound, report: &Report) -> bool {
    let within = match bound {
        Bound::Zero => report.over_admissions == 0,
        // Over a key's limit by at most that limit (RELIABILITY.md, "Failover").
        Bound::LostLeases => check::keys_over(report, |limit| limit).is_empty(),
        Bound::MustExceed => return report.over_admissions > 0,
    };
    within && report.slots_leaked == 0 && report.token_violations == 0
}

/// The scenario's line, its fields in this order (a JSON object is unordered; people read it in order);
/// the checker's figures are null when it could not read the histories.
fn report(
    scenario: &Scenario,
    (verdict, waits): (&Result<Report, ReadError>, Option<&Waits>),
    ok: Option<bool>,
    started: Instant,
    dir: &std::path::Path,
) -> String {
    let checked = verdict.as_ref().ok();
    let field = |f: fn(&Report) -> u64| json!(checked.map(f));
    let result = match ok {
        Some(true) => "within bound",
        Some(false) => "OVER BOUND",
        None => "unchecked",
    };
    let fields = [
        ("scenario", json!(scenario.name)),
        ("operations", field(|r| r.operations)),
        ("admissions", field(|r| r.admissions)),
        (
            "over_admission",
            json!({"count": field(|r| r.over_admissions), "largest_excess": field(|r| r.largest_excess)}),
        ),
        ("slots_leaked", field(|r| r.slots_leaked)),
        ("permits_lost", field(|r| r.permits_lost)),
        ("fault_ms", json!(checked.and_then(check::fault_ms))),
        ("recovery_ms", json!(checked.and_then(check::recovery_ms))),
        ("token_violations", field(|r| r.token_violations)),
        ("waiting", waits.map_or(Value::Null, Waits::json)),
        ("bound", json!(scenario.bound.text())),
        ("result", json!(result)),
        (
            "keys_over",
            json!(checked.map_or(Vec::new(), |r| check::keys_over(r, |_| 0))),
        ),
        (
            "checker_error",
            json!(verdict.as_ref().err().map(ToString::to_string)),
        ),
        ("seconds", json!(started.elapsed().as_secs())),
        ("histories", json!(dir.display().to_string())),
    ];
    let inner: Vec<String> = fields
        .iter()
        // (Only a run of waiters has a "waiting".)
        .filter(|(name, value)| *name != "waiting" || !value.is_null())
        .map(|(name, value)| format!("{}:{value}", json!(name)))
        .collect();
    format!("{{{}}}", inner.join(","))
}
