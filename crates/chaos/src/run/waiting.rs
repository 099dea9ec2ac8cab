//! What `waiters-faulted` checks beyond the checker's verdict, from the histories and the store: waiting
//! resumes after the faults (every waiter still running has an ask after them admitted), and no ticket is
//! left in a key's queue once the holders have ended and a ticket's lease has passed.

use std::path::PathBuf;
use std::time::Duration;

use inflight::AcquireOptions;
use serde_json::{json, Value};

use crate::history::{lines, History, PermitInfo};
use crate::holder::keys_of;

/// How many tickets the keys' queues hold (`ZCARD <prefix>{key}:queue`) on the server at `port`; `None`
/// when it cannot be read.
pub(crate) fn tickets(port: u16) -> Option<u64> {
    let mut conn = test_support::procs::connect(port).ok()?;
    let mut total = 0;
    for key in keys_of("multi") {
        let n: u64 = redis::cmd("ZCARD")
            .arg(format!("inflight:{{{key}}}:queue"))
            .query(&mut conn)
            .ok()?;
        total += n;
    }
    Some(total)
}

/// One admission and release on each key, in the runner's history: the admission that meets a queue
/// drops the tickets whose lease has ended (as the next of any process would).
pub(crate) async fn probe(url: &str, runner: &History, lease_ms: u64) {
    let Some(limiter) = super::limiter(url) else {
        return;
    };
    for key in keys_of("multi") {
        let info = PermitInfo {
            keys: vec![key.clone()],
            id: format!("runner-probe-{key}"),
            weight: 1,
            lease_ms,
        };
        let options = AcquireOptions::new()
            .id(info.id.clone())
            .lease(Duration::from_millis(lease_ms));
        let invoke = runner.now();
        let acquired = limiter.try_acquire_with(&key, options).await;
        let times = (invoke, runner.now());
        let Ok(permit) = acquired else {
            runner.permit_op("acquire", &info, times, "full", None);
            continue;
        };
        let token = crate::holder::token_of(&permit);
        runner.permit_op("acquire", &info, times, "admitted", token);
        let invoke = runner.now();
        let result = if permit.release().await.is_ok() {
            "released"
        } else {
            "error"
        };
        runner.permit_op("release", &info, (invoke, runner.now()), result, token);
    }
}

/// The tickets in the queues when the holders had ended, and a ticket's lease later.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Tickets {
    pub(crate) at_end: Option<u64>,
    pub(crate) left: Option<u64>,
}

/// How waiting went: read from the histories after the run.
#[derive(Debug, Clone, Default)]
pub(crate) struct Waits {
    /// Asks made after the faults' end and admitted.
    admitted_after: u64,
    /// The waiters still running with such an admission, and those without one.
    resumed: Vec<String>,
    stalled: Vec<String>,
    /// Asks refused as full (a wait that ran out, mostly).
    timeouts: u64,
    tickets: Tickets,
}

impl Waits {
    /// Reads the holders' histories among `files`; `killed` names the processes that did not survive.
    pub(crate) fn read(files: &[PathBuf], killed: &[&str], tickets: Tickets) -> Self {
        let fault_end = files
            .iter()
            .flat_map(|file| lines(file))
            .filter(|line| line.op == "fault")
            .map(|line| line.complete_ns)
            .max()
            .unwrap_or(u64::MAX);
        let mut waits = Self {
            tickets,
            ..Self::default()
        };
        for file in files {
            let lines = lines(file);
            let Some(process) = lines.first().map(|l| l.process.as_str()) else {
                continue;
            };
            if !process.starts_with("rust-") {
                continue;
            }
            let acquires = lines.iter().filter(|l| l.op == "acquire");
            let admitted_after = acquires
                .clone()
                .filter(|l| l.result == "admitted" && l.invoke_ns > fault_end)
                .count() as u64;
            waits.timeouts += acquires.filter(|l| l.result == "full").count() as u64;
            waits.admitted_after += admitted_after;
            if killed.contains(&process) {
                continue;
            }
            let list = if admitted_after > 0 {
                &mut waits.resumed
            } else {
                &mut waits.stalled
            };
            list.push(process.to_owned());
        }
        waits.resumed.sort();
        waits.stalled.sort();
        waits
    }

    /// Whether waiting resumed everywhere and no ticket was left.
    pub(crate) fn within(&self) -> bool {
        self.admitted_after > 0 && self.stalled.is_empty() && self.tickets.left == Some(0)
    }

    /// As the scenario's line shows it.
    pub(crate) fn json(&self) -> Value {
        json!({
            "admitted_after_faults": self.admitted_after,
            "resumed": self.resumed,
            "stalled": self.stalled,
            "timeouts": self.timeouts,
            "tickets_at_end": self.tickets.at_end,
            "tickets_left": self.tickets.left,
        })
    }
}
