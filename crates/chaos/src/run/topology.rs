//! What a scenario runs: a Redis topology (test-support's, shared with the tests), `inflight serve` and
//! `inflight proxy` processes, and the holder processes.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use test_support::procs::{self, Nodes};
use test_support::{TestCluster, TestSentinel};

/// Which Redis a scenario runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// One redis-server.
    Standalone,
    /// A primary, a replica and 3 sentinels.
    Sentinel,
    /// 3 primaries and 3 replicas.
    Cluster,
}

/// A running Redis topology, stopped when dropped.
pub(crate) enum Topology {
    /// One server on `port`, which may be killed and started again empty on the same port.
    Standalone {
        nodes: Nodes,
        port: u16,
    },
    Sentinel(TestSentinel),
    Cluster(TestCluster),
}

impl Topology {
    /// Starts one of `kind` and waits until it serves.
    pub(crate) fn start(kind: Kind) -> Self {
        match kind {
            Kind::Standalone => {
                let nodes = Nodes::new("chaos");
                let port = procs::free_ports(1)[0];
                nodes.spawn(port, None, &[]);
                procs::wait_ping(port);
                Self::Standalone { nodes, port }
            }
            Kind::Sentinel => Self::Sentinel(TestSentinel::start()),
            Kind::Cluster => Self::Cluster(TestCluster::start()),
        }
    }

    /// The store URL of the topology.
    pub(crate) fn url(&self) -> String {
        match self {
            Self::Standalone { port, .. } => format!("redis://127.0.0.1:{port}"),
            Self::Sentinel(sentinel) => sentinel.url(),
            Self::Cluster(cluster) => cluster.url(),
        }
    }

    /// The standalone server's port.
    pub(crate) fn port(&self) -> Option<u16> {
        match self {
            Self::Standalone { port, .. } => Some(*port),
            _ => None,
        }
    }

    /// Starts the standalone server again, empty, on its port.
    pub(crate) fn restart(&self) {
        if let Self::Standalone { nodes, port } = self {
            nodes.kill(*port);
            nodes.spawn(*port, None, &[]);
            procs::wait_ping(*port);
        }
    }

    /// The standalone server's process id.
    pub(crate) fn pid(&self) -> Option<u32> {
        match self {
            Self::Standalone { nodes, port } => nodes.pid(*port),
            _ => None,
        }
    }
}

/// A child process of the run, known by name, killed when dropped.
pub(crate) struct Proc {
    /// Its name (a holder's process name in the history).
    pub(crate) name: String,
    child: Child,
}

impl Proc {
    /// Starts `command` with its output to `log`.
    pub(crate) fn spawn(name: &str, mut command: Command, log: &Path) -> std::io::Result<Self> {
        let log = std::fs::File::create(log)?;
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        Ok(Self {
            name: name.to_owned(),
            child,
        })
    }

    /// Sends `signal` (`KILL`, `STOP`, `CONT`, `TERM`).
    pub(crate) fn signal(&self, signal: &str) {
        signal_pid(self.child.id(), signal);
    }

    /// Waits for it to exit until `deadline`, then kills it.
    pub(crate) fn wait_until(&mut self, deadline: Instant) {
        if !poll(deadline, || matches!(self.child.try_wait(), Ok(Some(_)))) {
            procs::kill(&mut self.child);
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.signal("CONT");
        procs::kill(&mut self.child);
    }
}

/// Sends `signal` to `pid` with `kill(1)`.
pub(crate) fn signal_pid(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Polls `done` every 50 ms until it is true (then true) or `deadline` passes.
pub(crate) fn poll(deadline: Instant, mut done: impl FnMut() -> bool) -> bool {
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// Starts `inflight serve` (or `proxy`, with `extra` flags) on `store`, with the run's limits; its address
/// once it listens (within 20 s).
pub(crate) fn start_inflight(
    inflight: &Path,
    mode: &str,
    store: &str,
    lease_ms: u64,
    extra: &[String],
    dir: &Path,
) -> std::io::Result<(Proc, String)> {
    let addr = format!("127.0.0.1:{}", procs::free_ports(1)[0]);
    let mut command = Command::new(inflight);
    command
        .arg(mode)
        .args(["--listen", &addr, "--store", store, "--workers", "1"])
        .args(["--lease", &format!("{lease_ms}ms"), "--log-level", "warn"])
        .args(
            [1, 4, 64]
                .iter()
                .flat_map(|n| ["--limit".to_owned(), format!("l{n}:*={n}")]),
        )
        .args(extra);
    let proc = Proc::spawn(mode, command, &dir.join(format!("{mode}.log")))?;
    let deadline = Instant::now() + Duration::from_secs(20);
    if !poll(deadline, || TcpStream::connect(&addr).is_ok()) {
        return Err(std::io::Error::other(format!(
            "inflight {mode} did not listen"
        )));
    }
    Ok((proc, addr))
}

/// The `inflight` binary beside this one (`target/debug/inflight`, say).
pub(crate) fn default_inflight() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("inflight")))
        .unwrap_or_else(|| PathBuf::from("inflight"))
}
