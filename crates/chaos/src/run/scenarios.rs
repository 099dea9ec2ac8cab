//! The scenarios: a topology, a fault, and the over-admission bound that applies to it.

use std::time::{Duration, Instant};

use super::relay::{Mode, Relay};
use super::topology::{poll, signal_pid, Kind, Proc, Topology};
use crate::history::History;

/// A fault a scenario injects once, a third of the way into its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Two holders SIGKILLed while holding.
    KillHolders,
    /// Two holders SIGSTOPped for twice the lease, then continued.
    StopHolders,
    /// Redis SIGKILLed and started again, empty, a second later.
    KillRedis,
    /// Redis SIGSTOPped for 2.5 s (past the clients' 1 s response timeout), then continued.
    PauseRedis,
    /// `SCRIPT FLUSH` every 100 ms for 3 s.
    ScriptFlush,
    /// 20-200 ms on every chunk of the Redis link for 3 s.
    Latency,
    /// One chunk in ten held back 0.3-1.5 s (lost packets resent) for 3 s.
    Drops,
    /// Every Redis connection reset every 250 ms for 3 s.
    Resets,
    /// The Sentinel primary SIGKILLed; the run waits for the sentinels to name another.
    SentinelFailover,
    /// The Cluster primary of `l4:a`'s slot SIGKILLed; the run waits for its replica to take over.
    ClusterPrimaryLost,
    /// `l4:a`'s slot moved to another primary and back, three times.
    SlotMove,
    /// Proxy clients that drop their connections mid-answer, for 3 s.
    ProxyStorm,
    /// Waiting holders hit at once: [`KILLED`] SIGKILLed; [`PAUSED`] SIGSTOPped and [`CUT`]'s link to
    /// Redis cut, both for a ticket's lease and a half second more, then continued and restored.
    Waiters,
}

/// The waiter a [`Fault::Waiters`] kills.
pub(crate) const KILLED: &str = "rust-0";
/// The waiter it pauses.
pub(crate) const PAUSED: &str = "rust-1";
/// The waiter it cuts from Redis: the only holder of its run behind the relay.
pub(crate) const CUT: &str = "rust-2";

/// The most a scenario may over-admit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bound {
    /// Never over a limit.
    Zero,
    /// RELIABILITY.md "Failover": only through lost leases, so on a key at most its limit over it.
    LostLeases,
    /// A control: the run must be over a limit (the library's holders enforce 2 where every history
    /// says 1), or the harness and the checker would miss what they are there to catch.
    MustExceed,
}

impl Bound {
    /// As the report prints it.
    pub(crate) fn text(self) -> &'static str {
        match self {
            Self::Zero => "0",
            Self::LostLeases => "lost leases: excess <= the key's limit (RELIABILITY.md, Failover)",
            Self::MustExceed => "a control: must be over (the library's holders enforce 2 on l1:*)",
        }
    }
}

/// One scenario (the fields: [`all`]'s columns).
#[derive(Debug, Clone)]
pub(crate) struct Scenario {
    pub(crate) name: &'static str,
    pub(crate) topology: Kind,
    pub(crate) relay: bool,
    pub(crate) fault: Fault,
    pub(crate) bound: Bound,
    pub(crate) quick: bool,
}

/// Every scenario, in the order a run takes them.
#[rustfmt::skip]
pub(crate) fn all() -> Vec<Scenario> {
    use Fault::*;
    use Kind::*;
    let s = |name, topology, relay, fault, bound, quick| Scenario { name, topology, relay, fault, bound, quick };
    vec![
        // name (`--only`)       topology    relay  fault               bound                quick (`--quick`)
        s("holders-killed",       Standalone, false, KillHolders,        Bound::Zero,         true),
        s("holders-stopped",      Standalone, false, StopHolders,        Bound::Zero,         true),
        s("redis-killed",         Standalone, false, KillRedis,          Bound::LostLeases,   true),
        s("redis-paused",         Standalone, false, PauseRedis,         Bound::Zero,         true),
        s("script-flush",         Standalone, false, ScriptFlush,        Bound::Zero,         true),
        s("link-latency",         Standalone, true,  Latency,            Bound::Zero,         false),
        s("link-drops",           Standalone, true,  Drops,              Bound::Zero,         true),
        s("link-resets",          Standalone, true,  Resets,             Bound::Zero,         true),
        s("proxy-storm",          Standalone, false, ProxyStorm,         Bound::Zero,         true),
        s("waiters-faulted",      Standalone, true,  Waiters,            Bound::Zero,         true),
        s("sentinel-failover",    Sentinel,   false, SentinelFailover,   Bound::LostLeases,   true),
        s("cluster-primary-lost", Cluster,    false, ClusterPrimaryLost, Bound::LostLeases,   false),
        // (Not quick: the quick run stays on one server and Sentinel; RELIABILITY.md has what it found.)
        s("cluster-slot-moved",   Cluster,    false, SlotMove,           Bound::Zero,         false),
        s("control-loose-limit",  Standalone, false, ScriptFlush,        Bound::MustExceed,   true),
    ]
}

/// What a fault acts on: the topology, the relay (when the holders use one), the holder processes, the
/// lease of every permit, and how to start `n` storming proxy clients for `duration_ms`.
pub(crate) struct Stage<'a> {
    pub(crate) topology: &'a Topology,
    pub(crate) relay: Option<&'a Relay>,
    pub(crate) holders: &'a [Proc],
    pub(crate) lease_ms: u64,
    pub(crate) storm: &'a dyn Fn(usize, u64) -> Vec<Proc>,
}

/// Injects `fault`; its window on `clock` (when it was in force).
pub(crate) fn inject(fault: Fault, stage: &Stage<'_>, clock: &History) -> (u64, u64) {
    let lease = Duration::from_millis(stage.lease_ms);
    let start = clock.now();
    match fault {
        Fault::KillHolders => {
            victims(stage.holders).for_each(|p| p.signal("KILL"));
        }
        Fault::StopHolders => {
            victims(stage.holders).for_each(|p| p.signal("STOP"));
            std::thread::sleep(2 * lease);
            victims(stage.holders).for_each(|p| p.signal("CONT"));
        }
        Fault::KillRedis => {
            if let Some(pid) = stage.topology.pid() {
                signal_pid(pid, "KILL");
            }
            std::thread::sleep(Duration::from_secs(1));
            stage.topology.restart();
        }
        Fault::PauseRedis => {
            let pid = stage.topology.pid();
            pid.inspect(|&pid| signal_pid(pid, "STOP"));
            std::thread::sleep(Duration::from_millis(2500));
            pid.inspect(|&pid| signal_pid(pid, "CONT"));
        }
        Fault::ScriptFlush => {
            let port = stage.topology.port().unwrap_or_default();
            let until = Instant::now() + Duration::from_secs(3);
            while Instant::now() < until {
                if let Ok(mut conn) = test_support::procs::connect(port) {
                    let _: redis::RedisResult<()> =
                        redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Fault::Latency | Fault::Drops => {
            let relay = stage.relay.expect("a relay");
            let mode = if fault == Fault::Latency {
                Mode::Latency
            } else {
                Mode::Drops
            };
            relay.set(mode);
            std::thread::sleep(Duration::from_secs(3));
            relay.set(Mode::Clear);
        }
        Fault::Resets => {
            let relay = stage.relay.expect("a relay");
            for _ in 0..12 {
                relay.reset_all();
                std::thread::sleep(Duration::from_millis(250));
            }
        }
        Fault::SentinelFailover => {
            if let Topology::Sentinel(sentinel) = stage.topology {
                let old = sentinel.primary();
                sentinel.kill_primary();
                poll(Instant::now() + Duration::from_secs(20), || {
                    sentinel.named_primary().is_some_and(|p| p != old)
                });
            }
        }
        Fault::ClusterPrimaryLost => {
            if let Topology::Cluster(cluster) = stage.topology {
                let slot = cluster.slot_of("inflight:{l4:a}");
                if let Some(primary) = cluster.primary_of_slot(slot) {
                    cluster.kill(primary);
                    poll(Instant::now() + Duration::from_secs(20), || {
                        cluster.primary_of_slot(slot).is_some_and(|p| p != primary)
                    });
                }
            }
        }
        Fault::SlotMove => {
            if let Topology::Cluster(cluster) = stage.topology {
                let slot = cluster.slot_of("inflight:{l4:a}");
                let from = cluster.primary_of_slot(slot);
                let to = cluster.primaries().into_iter().find(|&p| Some(p) != from);
                if let (Some(from), Some(to)) = (from, to) {
                    // Away and back, three times: each move splits the slot's keys a while.
                    for n in 0..6 {
                        let (a, b) = if n % 2 == 0 { (from, to) } else { (to, from) };
                        cluster.move_slot(slot, a, b);
                        std::thread::sleep(Duration::from_millis(250));
                    }
                }
            }
        }
        Fault::Waiters => {
            let named = |name: &'static str| stage.holders.iter().filter(move |p| p.name == name);
            let relay = stage.relay.expect("a relay");
            named(KILLED).for_each(|p| p.signal("KILL"));
            named(PAUSED).for_each(|p| p.signal("STOP"));
            relay.set(Mode::Cut);
            // Past a ticket's lease (and a permit's): the store drops what the two stopped renewing.
            std::thread::sleep(Duration::from_millis(inflight::TICKET_LEASE_MS + 500));
            named(PAUSED).for_each(|p| p.signal("CONT"));
            relay.set(Mode::Clear);
        }
        Fault::ProxyStorm => {
            let deadline = Instant::now() + Duration::from_secs(15);
            for mut client in (stage.storm)(6, 3000) {
                client.wait_until(deadline);
            }
        }
    }
    (start, clock.now())
}

/// The holders a fault on holders hits: the first two of the library's, Python's and the HTTP API's
/// (a proxy client killed would be released by the proxy at once, which its history cannot say).
pub(crate) fn victims(holders: &[Proc]) -> impl Iterator<Item = &Proc> {
    holders.iter().filter(|p| {
        let (kind, n) = p.name.split_once('-').unwrap_or_default();
        matches!(kind, "rust" | "py" | "http") && matches!(n, "0" | "1")
    })
}

/// The holders `fault` SIGKILLs (their histories end at the kill).
pub(crate) fn killed(fault: Fault, holders: &[Proc]) -> Vec<&Proc> {
    match fault {
        Fault::KillHolders => victims(holders).collect(),
        Fault::Waiters => holders.iter().filter(|p| p.name == KILLED).collect(),
        _ => Vec::new(),
    }
}

/// Whether `process` reaches Redis through the run's relay, where there is one: every process, but in
/// a [`Fault::Waiters`] run only [`CUT`].
pub(crate) fn relayed(fault: Fault, process: &str) -> bool {
    fault != Fault::Waiters || process == CUT
}
