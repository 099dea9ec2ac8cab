//! A primary, its replica and 3 sentinels on free ports, quick to fail over
//! (`down-after-milliseconds` [`DOWN_AFTER_MS`]), stopped when dropped.

use std::time::Duration;

use crate::procs::{self, Nodes};

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
    nodes: Nodes,
}

impl TestSentinel {
    /// Starts the primary and its replica, then the sentinels, and waits until the replica is in sync
    /// and every sentinel knows the replica and the other two sentinels (so that it can fail over).
    pub fn start() -> Self {
        let nodes = Nodes::new("sentinel");
        let ports = procs::free_ports(5);
        let (primary, replica) = (ports[0], ports[1]);
        let primary_port = primary.to_string();
        nodes.spawn(primary, None, &procs::FAST_SYNC);
        procs::wait_ping(primary);
        // DEBUG SLEEP lets a test hold the replica back from catching up.
        let mut args = vec!["--replicaof", "127.0.0.1", &primary_port];
        args.extend(procs::debug_command_args("local"));
        args.extend(procs::FAST_SYNC);
        nodes.spawn(replica, None, &args);
        for &port in &ports[2..] {
            let config = nodes.dir.join(format!("sentinel-{port}.conf"));
            let text = format!(
                "sentinel monitor {MASTER} 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n\
                 sentinel failover-timeout {MASTER} {FAILOVER_TIMEOUT_MS}\n\
                 sentinel parallel-syncs {MASTER} 1\n"
            );
            std::fs::write(&config, text).expect("write a sentinel's config");
            nodes.spawn(port, Some(&config), &["--sentinel"]);
        }
        let topology = Self { ports, nodes };
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
        format!(
            "redis+sentinel://{}/{MASTER}",
            procs::addrs(&self.ports[2..])
        )
    }

    /// The builder of a store on this topology, with the test timeouts.
    pub fn store_builder(&self) -> inflight::RedisStoreBuilder {
        crate::store_builder(self.url())
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
        self.nodes.kill(self.ports[0]);
    }
}
