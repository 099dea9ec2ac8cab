//! A primary, its replica and 3 sentinels on free ports, quick to fail over
//! (`down-after-milliseconds` [`DOWN_AFTER_MS`]), stopped when dropped.

use std::process::Child;
use std::sync::Mutex;
use std::time::Duration;

use inflight::RedisStore;

use crate::procs::{self, Watchdog};

/// How long the sentinels wait before they call a silent primary down.
pub const DOWN_AFTER_MS: u64 = 400;
/// How long a failover may take before the sentinels try again (after twice this).
pub const FAILOVER_TIMEOUT_MS: u64 = 1000;
/// The name the sentinels know the primary by.
pub const MASTER: &str = "inflightmaster";

/// A Sentinel topology of this test's own.
pub struct TestSentinel {
    /// Primary, replica, then the three sentinels.
    ports: Vec<u16>,
    nodes: Mutex<Vec<Option<Child>>>,
    watchdog: Mutex<Watchdog>,
}

impl TestSentinel {
    /// Starts the primary and its replica, then the sentinels, and waits until the replica is in sync
    /// and every sentinel knows the replica and the other two sentinels (so that it can fail over).
    pub fn start() -> Self {
        let dir = procs::scratch_dir("sentinel");
        let mut watchdog = Watchdog::start(&dir);
        let ports = procs::free_ports(5);
        let (primary, replica) = (ports[0], ports[1]);
        let mut nodes = Vec::new();
        let primary_port = primary.to_string();
        let fast = [
            "--repl-diskless-sync",
            "yes",
            "--repl-diskless-sync-delay",
            "0",
        ];
        nodes.push(procs::spawn_server(&dir, primary, None, &fast));
        procs::wait_ping(primary);
        // DEBUG SLEEP lets a test hold the replica back from catching up.
        let mut args = vec![
            "--replicaof",
            "127.0.0.1",
            &primary_port,
            "--enable-debug-command",
            "local",
        ];
        args.extend(fast);
        nodes.push(procs::spawn_server(&dir, replica, None, &args));
        for &port in &ports[2..] {
            let config = dir.join(format!("sentinel-{port}.conf"));
            let text = format!(
                "sentinel monitor {MASTER} 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n\
                 sentinel failover-timeout {MASTER} {FAILOVER_TIMEOUT_MS}\n\
                 sentinel parallel-syncs {MASTER} 1\n"
            );
            std::fs::write(&config, text).expect("write a sentinel's config");
            nodes.push(procs::spawn_server(
                &dir,
                port,
                Some(&config),
                &["--sentinel"],
            ));
        }
        for node in &nodes {
            watchdog.watch(node.id());
        }
        let topology = Self {
            ports,
            nodes: Mutex::new(nodes.into_iter().map(Some).collect()),
            watchdog: Mutex::new(watchdog),
        };
        procs::wait_until(Duration::from_secs(10), "the replica in sync", || {
            procs::info_field(replica, "replication", "master_link_status").as_deref() == Some("up")
        });
        for &port in &topology.ports[2..] {
            procs::wait_ping(port);
            procs::wait_until(
                Duration::from_secs(15),
                "a sentinel to know everyone",
                || {
                    topology.sentinel_count(port, "replicas") == Some(1)
                        && topology.sentinel_count(port, "sentinels") == Some(2)
                },
            );
        }
        topology
    }

    fn sentinel_count(&self, port: u16, what: &str) -> Option<usize> {
        let mut conn = procs::connect(port).ok()?;
        let list: Vec<redis::Value> = redis::cmd("SENTINEL")
            .arg(what)
            .arg(MASTER)
            .query(&mut conn)
            .ok()?;
        Some(list.len())
    }

    /// `redis+sentinel://` with the three sentinels.
    pub fn url(&self) -> String {
        let sentinels: Vec<String> = self.ports[2..]
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        format!("redis+sentinel://{}/{MASTER}", sentinels.join(","))
    }

    /// The builder of a store on this topology, with the test timeouts.
    pub fn store_builder(&self) -> inflight::RedisStoreBuilder {
        RedisStore::builder(self.url())
            .response_timeout(Duration::from_millis(500))
            .connection_timeout(Duration::from_millis(200))
    }

    /// The port of the first primary, and of its replica.
    pub fn primary(&self) -> u16 {
        self.ports[0]
    }

    pub fn replica(&self) -> u16 {
        self.ports[1]
    }

    /// The primary a sentinel names now.
    pub fn named_primary(&self) -> Option<u16> {
        let mut conn = procs::connect(self.ports[2]).ok()?;
        let (_, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(MASTER)
            .query(&mut conn)
            .ok()?;
        Some(port)
    }

    /// A plain connection to the primary or the replica.
    pub fn node(&self, port: u16) -> redis::Connection {
        procs::connect(port).expect("connect to a node")
    }

    /// Kills the first primary with SIGKILL.
    pub fn kill_primary(&self) {
        if let Some(mut child) = self.nodes.lock().unwrap()[0].take() {
            procs::kill(&mut child);
        }
    }
}

impl Drop for TestSentinel {
    fn drop(&mut self) {
        for child in self.nodes.lock().unwrap().iter_mut().flatten() {
            procs::kill(child);
        }
        self.watchdog.lock().unwrap().finish();
    }
}
