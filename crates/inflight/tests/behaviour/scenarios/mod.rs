//! The behaviour every store must have, written once; `main.rs` instantiates it per store. By theme:
//! admission at the limit, ids and weights (admission.rs); how a permit is held, by a guard, a stream,
//! a scope or from phase to phase (permits.rs); leases, renewals and their loss (leases.rs); limits,
//! overrides, classes of keys and policies (limits.rs); permits on several keys (several_keys.rs); and
//! fencing tokens (fencing.rs).

mod admission;
mod fencing;
mod holders;
mod leases;
mod limits;
mod permits;
mod several_keys;

pub use admission::*;
pub use fencing::*;
pub use holders::*;
pub use leases::*;
pub use limits::*;
pub use permits::*;
pub use several_keys::*;

use std::time::Duration;

use inflight::{ClassLimits, Policy};

const LEASE: Duration = Duration::from_secs(30);

/// Waits (bounded) until the key's in-flight count is `want`: a dropped permit may release in the
/// background when the store cannot release synchronously.
pub async fn settle<S: inflight::Store>(limiter: &inflight::Limiter<S>, key: &str, want: u32) {
    for _ in 0..200 {
        if limiter.status(key).await.unwrap().in_flight == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("in_flight of {key:?} did not settle at {want}");
}

/// Rules for the classes of keys of the example, and one more specific rule.
fn classes() -> Policy {
    Policy::new(0, 0)
        .rule("tenant:*", ClassLimits::new(2, 3))
        .and_then(|p| p.rule("app:*", ClassLimits::new(1, 0)))
        .and_then(|p| p.rule("app:big-*", ClassLimits::new(3, 0)))
        .and_then(|p| p.rule("global", ClassLimits::new(4, 0)))
        .unwrap()
}
