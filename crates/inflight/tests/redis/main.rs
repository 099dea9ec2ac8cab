//! What only a real, shared Redis can show: many processes on one key, crashes (processes.rs), outages
//! and restarts (outages.rs), the ways of connecting (connections.rs), the batches sent to Redis
//! (batches.rs), and what the store leaves in Redis and for how long (data.rs).
#![allow(missing_docs)]

mod abandoned;
mod batches;
mod connections;
mod data;
mod fair;
mod fresh;
mod outages;
mod processes;
#[path = "../support/mod.rs"]
mod support;
mod version;

use fair::wait_in_child;
use processes::{hammer, hold};

/// The load tests take the machine (4 busy child processes); the tests that time a recovery or a reclaim
/// wait for them rather than share 2 cores with them.
static MACHINE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

fn whole_machine() -> tokio::sync::RwLockWriteGuard<'static, ()> {
    MACHINE.blocking_write()
}

async fn timing_sensitive() -> tokio::sync::RwLockReadGuard<'static, ()> {
    MACHINE.read().await
}

/// The body of the child processes; does nothing unless started by `spawn_child`.
#[test]
#[ignore = "entry point of child processes, started by the tests of processes.rs"]
fn child_process() {
    let Ok(role) = std::env::var("INFLIGHT_TEST_CHILD") else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        match role.as_str() {
            "hammer" => hammer().await,
            "hold" => hold().await,
            "wait" => wait_in_child().await,
            other => panic!("unknown child role {other}"),
        }
    });
}
