//! Real redis-server processes for tests, on free ports, stopped when dropped: one server
//! ([`TestRedis`]), a Redis Cluster ([`TestCluster`]) or a primary, a replica and 3 sentinels
//! ([`TestSentinel`]).
#![allow(missing_docs)]

pub mod cluster;
mod fake;
pub mod procs;
pub mod sentinel;

use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;

use inflight::RedisStore;

pub use cluster::{unique_prefix, TestCluster};
pub use fake::old_redis;
pub use sentinel::TestSentinel;

/// A builder of a store on `url`, with the tests' short timeouts.
pub fn store_builder(url: String) -> inflight::RedisStoreBuilder {
    RedisStore::builder(url)
        .response_timeout(Duration::from_millis(500))
        .connection_timeout(Duration::from_millis(200))
}

/// A redis-server of this test's own ([`procs::server_bin`]), in a scratch directory of its own.
pub struct TestRedis {
    server: Option<Child>,
    port: u16,
    dir: PathBuf,
}

impl TestRedis {
    /// Starts a redis-server on a free port and waits until it answers. A port another test's server
    /// took between the look-up and the start (what answers is then not this one) is given up for another.
    pub fn start() -> Self {
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|listener| listener.local_addr())
                .expect("a free port")
                .port();
            let mut redis = Self {
                server: None,
                port,
                dir: procs::scratch_dir("redis"),
            };
            if redis.try_spawn() {
                return redis;
            }
        }
        panic!("redis-server never started on a port of its own");
    }

    /// Starts the server on this port; false when what answers there is not it.
    fn try_spawn(&mut self) -> bool {
        let debug = procs::debug_command_args("yes");
        let mut child = procs::spawn_server(&self.dir, self.port, None, &debug);
        procs::wait_ping(self.port);
        let pid = procs::info_field(self.port, "server", "process_id");
        if pid.as_deref() == Some(child.id().to_string().as_str()) {
            self.server = Some(child);
            return true;
        }
        procs::kill(&mut child);
        false
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A store on this server (lazy: connects on first use).
    pub fn store(&self) -> RedisStore {
        self.store_builder().open().expect("test redis url")
    }

    /// The builder of [`TestRedis::store`], for tests that set more.
    pub fn store_builder(&self) -> inflight::RedisStoreBuilder {
        store_builder(self.url())
    }

    /// A plain connection, to look at what the store wrote.
    pub fn client(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .expect("connect to the test redis")
    }

    /// How many scripts (EVAL and EVALSHA) the server has run so far.
    pub fn scripts_run(&self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.client())
            .expect("INFO commandstats");
        info.lines()
            .filter(|line| {
                line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:")
            })
            .filter_map(|line| {
                line.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }

    /// Kills the server (SIGKILL): everything it held is gone.
    pub fn stop(&mut self) {
        if let Some(mut server) = self.server.take() {
            procs::kill(&mut server);
        }
    }

    /// Starts an empty server on the same port again.
    pub fn restart(&mut self) {
        self.stop();
        assert!(
            self.try_spawn(),
            "redis-server did not start on {}",
            self.port
        );
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
