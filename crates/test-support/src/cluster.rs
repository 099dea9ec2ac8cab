//! A Redis Cluster of 3 primaries and 3 replicas on free ports, made with `redis-cli --cluster create`,
//! stopped when dropped (or, for [`TestCluster::shared`], when the test process ends).

use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::procs::{self, Nodes};

/// How long a node may be unreachable before the cluster fails it over (its replica is promoted after
/// about twice this).
pub const NODE_TIMEOUT_MS: u64 = 500;

/// A cluster of this test's own.
pub struct TestCluster {
    ports: Vec<u16>,
    nodes: Nodes,
}

impl TestCluster {
    /// Starts 3 primaries and 3 replicas and waits until every node says `cluster_state:ok` and every
    /// replica is in sync.
    pub fn start() -> Self {
        let nodes = Nodes::new("cluster");
        let ports = procs::free_ports(6);
        let timeout = NODE_TIMEOUT_MS.to_string();
        // DEBUG SLEEP lets a test hold a replica back from catching up.
        let debug = procs::debug_command_args("local");
        for &port in &ports {
            let config = format!("nodes-{port}.conf");
            let mut args = vec![
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &config,
                "--cluster-node-timeout",
                &timeout,
                // Any replica may take over, however long it was cut off.
                "--cluster-replica-validity-factor",
                "0",
                "--cluster-allow-replica-migration",
                "no",
            ];
            args.extend(procs::FAST_SYNC);
            args.extend(&debug);
            nodes.spawn(port, None, &args);
        }
        for &port in &ports {
            procs::wait_ping(port);
        }
        let cluster = Self { ports, nodes };
        let mut create = Command::new(procs::cli_bin());
        create.arg("--cluster").arg("create");
        for port in &cluster.ports {
            create.arg(format!("127.0.0.1:{port}"));
        }
        let out = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        cluster.wait_healthy(Duration::from_secs(20));
        cluster
    }

    /// One cluster for every test of this test binary; tests keep apart by their prefixes
    /// ([`unique_prefix`]) and must not stop nodes.
    pub fn shared() -> &'static TestCluster {
        static SHARED: OnceLock<TestCluster> = OnceLock::new();
        SHARED.get_or_init(TestCluster::start)
    }

    /// `redis+cluster://` with every node.
    pub fn url(&self) -> String {
        format!("redis+cluster://{}", procs::addrs(&self.ports))
    }

    /// The builder of a store on this cluster, with the test timeouts and `prefix`.
    pub fn store_builder(&self, prefix: &str) -> inflight::RedisStoreBuilder {
        crate::store_builder(self.url()).prefix(prefix)
    }

    /// The ports of the nodes that are primaries now and serve slots, as the live nodes see it.
    pub fn primaries(&self) -> Vec<u16> {
        let mut primaries: Vec<u16> = self
            .nodes
            .live()
            .into_iter()
            .filter(|&port| {
                procs::info_field(port, "replication", "role").as_deref() == Some("master")
            })
            .collect();
        primaries.sort_unstable();
        primaries
    }

    /// The primary serving `slot`, as a live node sees it.
    pub fn primary_of_slot(&self, slot: u16) -> Option<u16> {
        use redis::{from_redis_value_ref as read, Value};
        self.nodes.live().into_iter().find_map(|port| {
            let mut conn = procs::connect(port).ok()?;
            let ranges: Vec<Vec<Value>> =
                redis::cmd("CLUSTER").arg("SLOTS").query(&mut conn).ok()?;
            // Each range: its first and last slot, then its primary (address, port, ...), then replicas.
            ranges.iter().find_map(|range| {
                let (from, to): (u16, u16) =
                    (read(range.first()?).ok()?, read(range.get(1)?).ok()?);
                let primary: Vec<Value> = read(range.get(2)?).ok()?;
                (from..=to)
                    .contains(&slot)
                    .then(|| read(primary.get(1)?).ok())?
            })
        })
    }

    /// The live replica of the primary on `port`.
    pub fn replica_of(&self, port: u16) -> Option<u16> {
        let wanted = port.to_string();
        self.nodes.live().into_iter().find(|&p| {
            procs::info_field(p, "replication", "master_port").as_deref() == Some(wanted.as_str())
        })
    }

    /// The slot of a Redis key, asked of a live node.
    pub fn slot_of(&self, key: &str) -> u16 {
        let port = self.nodes.live()[0];
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut procs::connect(port).expect("connect to a node"))
            .expect("CLUSTER KEYSLOT")
    }

    /// A cluster connection of the test's own, to look at what the store wrote.
    pub fn raw(&self) -> redis::cluster::ClusterConnection {
        let nodes: Vec<String> = self
            .nodes
            .live()
            .iter()
            .map(|port| format!("redis://127.0.0.1:{port}"))
            .collect();
        redis::cluster::ClusterClient::new(nodes)
            .and_then(|client| client.get_connection())
            .expect("connect to the cluster")
    }

    /// Moves `slot` from the primary on `from` to the one on `to`, its keys included, as
    /// `redis-cli --cluster reshard` does: IMPORTING and MIGRATING, MIGRATE, then the new owner
    /// announced to every primary.
    pub fn move_slot(&self, slot: u16, from: u16, to: u16) {
        let id = |port: u16| -> String {
            redis::cmd("CLUSTER")
                .arg("MYID")
                .query(&mut self.node(port))
                .expect("CLUSTER MYID")
        };
        let (from_id, to_id) = (id(from), id(to));
        let setslot = |port: u16, args: &[&str]| {
            let mut cmd = redis::cmd("CLUSTER");
            cmd.arg("SETSLOT").arg(slot).arg(args);
            let _: () = cmd.query(&mut self.node(port)).expect("CLUSTER SETSLOT");
        };
        setslot(to, &["IMPORTING", &from_id]);
        setslot(from, &["MIGRATING", &to_id]);
        let mut source = self.node(from);
        loop {
            let keys: Vec<String> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(100)
                .query(&mut source)
                .expect("CLUSTER GETKEYSINSLOT");
            if keys.is_empty() {
                break;
            }
            let _: redis::Value = redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(to)
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(&keys)
                .query(&mut source)
                .expect("MIGRATE");
        }
        for port in self.primaries() {
            setslot(port, &["NODE", &to_id]);
        }
    }

    /// A plain connection to one node.
    pub fn node(&self, port: u16) -> redis::Connection {
        procs::connect(port).expect("connect to a cluster node")
    }

    /// The lines of the node's log that contain `word` (the log is kept while the cluster runs).
    pub fn log_lines(&self, port: u16, word: &str) -> Vec<String> {
        std::fs::read_to_string(self.nodes.dir.join(format!("{port}.log")))
            .unwrap_or_default()
            .lines()
            .filter(|line| line.contains(word))
            .map(str::to_owned)
            .collect()
    }

    /// Kills the node on `port` with SIGKILL (its data is gone with it).
    pub fn kill(&self, port: u16) {
        self.nodes.kill(port);
    }

    /// Waits until every live node says `cluster_state:ok`, knows only live primaries, and every live
    /// replica is in sync with its primary.
    pub fn wait_healthy(&self, within: Duration) {
        procs::wait_until(within, "the cluster to be healthy", || {
            self.nodes.live().into_iter().all(|port| {
                let ok =
                    procs::info_field(port, "cluster", "cluster_state").as_deref() == Some("ok");
                let role = procs::info_field(port, "replication", "role");
                let synced = role.as_deref() == Some("master")
                    || procs::info_field(port, "replication", "master_link_status").as_deref()
                        == Some("up");
                ok && synced
            })
        });
    }
}

/// A prefix no other test of this process uses, for tests that share a topology.
pub fn unique_prefix(name: &str) -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("t{}-{name}:", NEXT.fetch_add(1, Ordering::Relaxed))
}
