//! The library's holder: a [`Limiter`] on a Redis store; renewals are the library's own, and a permit
//! that turns lost is logged as a renewal "lost".

use std::time::{Duration, Instant};

use inflight::{
    AcquireError, AcquireOptions, ClassLimits, FailurePolicy, Limiter, Permit, Policy, RedisStore,
};

use super::{HolderArgs, Rng, Task};
use crate::history::limit_of;

/// The policy of every run: keys `l1:*`, `l4:*`, `l64:*` have limits 1, 4 and 64; `loose` enforces 2
/// on `l1:*` (a control run).
pub(crate) fn policy(loose: bool) -> Policy {
    let mut policy = Policy::new(0, 0);
    for limit in [1, 4, 64] {
        let enforced = if loose && limit == 1 { 2 } else { limit };
        policy = policy
            .rule(&format!("l{limit}:*"), ClassLimits::new(enforced, 0))
            .expect("a valid rule");
    }
    policy
}

/// The fencing token of an admission (`None` for 0: nothing held, an unlimited key).
pub(crate) fn token_of(permit: &Permit) -> Option<u64> {
    Some(permit.token()).filter(|&token| token > 0)
}

/// The holder's limiter, with the store breaker off as `inflight` has it for Cluster: every admission
/// asks the store.
pub(super) fn limiter(args: &HolderArgs) -> crate::Result<Limiter<RedisStore>> {
    Ok(Limiter::builder(RedisStore::open(args.target.clone())?)
        .policy(policy(args.loose))
        .lease(Duration::from_millis(args.lease_ms))
        .on_store_failure(FailurePolicy::FailClosed)
        .store_breaker(false)
        .build())
}

/// One acquire, hold and release.
pub(super) async fn cycle(task: &Task, rng: &mut Rng, n: usize) {
    let limiter = task.limiter.as_ref().expect("the library's limiter");
    let info = task.next_permit(rng, n);
    let options = AcquireOptions::new()
        .id(info.id.clone())
        .weight(info.weight)
        .lease(Duration::from_millis(task.args.lease_ms));
    let keys: Vec<&str> = info.keys.iter().map(String::as_str).collect();
    let history = &task.history;
    let invoke = history.now();
    let acquired = if task.args.max_wait_ms > 0 {
        let options = wait_options(task, rng, n, options);
        limiter.acquire_all(&keys, options).await
    } else {
        limiter.try_acquire_all(&keys, options).await
    };
    let complete = history.now();
    let permit = match acquired {
        Ok(permit) => {
            // Admitted on a limited key, counted or not (under fail_open the store did not count it).
            let limited = info.keys.iter().any(|key| limit_of(key) > 0);
            let result = if limited { "admitted" } else { "unlimited" };
            history.permit_op(
                "acquire",
                &info,
                (invoke, complete),
                result,
                token_of(&permit),
            );
            permit
        }
        Err(refused) => {
            let result = match refused.error {
                AcquireError::Full { .. } | AcquireError::WeightExceedsLimit { .. } => "full",
                _ => "error",
            };
            history.permit_op("acquire", &info, (invoke, complete), result, None);
            // Not at once again: a refused key stays full a while, and an unreachable store too.
            tokio::time::sleep(Duration::from_millis(5 + rng.below(20))).await;
            return;
        }
    };
    let hold_until = Instant::now() + task.hold(rng);
    let (mut lost, mut expires_ms, mut token) = (false, permit.expires_at_ms(), token_of(&permit));
    while Instant::now() < hold_until {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if !lost && permit.is_lost() {
            lost = true;
            let now = history.now();
            history.permit_op("renew", &info, (now, now), "lost", token);
        }
        if !lost && permit.expires_at_ms() > expires_ms {
            expires_ms = permit.expires_at_ms();
            // A renewal seen as a later expiry; a lease re-added (it had gone) comes with a new token.
            let result = if token_of(&permit) == token {
                "renewed"
            } else {
                "readded"
            };
            token = token_of(&permit);
            // Redis granted it at `expires_ms - lease` (its clock is this machine's wall clock), so it
            // was invoked before that (5 ms before, for the clocks' rounding) and after the admission's
            // invoke. Its lease then lasts at least until the logged invoke + lease.
            let now = history.now();
            let granted_ns = expires_ms.saturating_sub(info.lease_ms) * 1_000_000;
            let renewed = granted_ns
                .saturating_sub(5_000_000)
                .max(invoke + 1)
                .min(now);
            history.permit_op("renew", &info, (renewed, now), result, token);
        }
    }
    let invoke = history.now();
    let released = permit.release().await;
    let result = if released.is_ok() {
        "released"
    } else {
        "error"
    };
    // The library's release names the token of the lease it holds.
    history.permit_op("release", &info, (invoke, history.now()), result, token);
}

/// A waiter's terms: a wait from 100 ms up to `--max-wait-ms` that ends by the run's end (none then: a
/// `try_acquire`); task 0 waits at priority 1, and the tasks wait in three flows (`f0`, `f1`, `f2`).
fn wait_options(task: &Task, rng: &mut Rng, n: usize, options: AcquireOptions) -> AcquireOptions {
    let left = task.until.saturating_duration_since(Instant::now());
    let wait = Duration::from_millis(100 + rng.below(task.args.max_wait_ms)).min(left);
    let options = options.max_wait(wait).flow(format!("f{}", n % 3));
    if n == 0 {
        options.priority(1)
    } else {
        options
    }
}
