//! Limits that change: overrides and their ceiling, classes of keys, a new policy.

use inflight::{ClassLimits, Limit, Policy};

use super::{classes, settle};
use crate::fixtures::Fixture;

pub async fn a_limit_change_applies_to_the_next_admission_in_every_process<F: Fixture>(f: F) {
    let one = f.limiter(Policy::new(1, 0));
    let two = f.limiter(Policy::new(1, 0));
    let _held = one.try_acquire("app").await.unwrap();
    assert!(two.try_acquire("app").await.unwrap_err().is_full());
    let status = one.set_limit("app", 2).await.unwrap();
    assert_eq!(
        (status.limit, status.override_limit, status.in_flight),
        (Limit::Limited(2), Some(2), 1)
    );
    let _second = two
        .try_acquire("app")
        .await
        .expect("the other process sees the new limit at once");
    one.clear_limit("app").await.unwrap();
    let status = two.status("app").await.unwrap();
    assert_eq!(
        (status.limit, status.override_limit, status.in_flight),
        (Limit::Limited(1), None, 2)
    );
    assert!(two.try_acquire("app").await.unwrap_err().is_full());
    // 0 clears too.
    one.set_limit("app", 4).await.unwrap();
    assert_eq!(one.set_limit("app", 0).await.unwrap().override_limit, None);
}

pub async fn the_ceiling_caps_every_override<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(3, 4));
    assert_eq!(
        limiter.set_limit("big", 10).await.unwrap().limit,
        Limit::Limited(4)
    );
    assert_eq!(
        limiter.set_limit("small", 2).await.unwrap().limit,
        Limit::Limited(2)
    );
    assert_eq!(
        limiter.status("plain").await.unwrap().limit,
        Limit::Limited(3)
    );
    let permits: Vec<_> =
        futures_util::future::join_all((0..6).map(|_| limiter.try_acquire("big"))).await;
    assert_eq!(permits.iter().filter(|p| p.is_ok()).count(), 4);
}

pub async fn an_override_limits_a_key_that_is_unlimited_by_default<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(0, 0));
    let free: Vec<_> = (0..10).map(|_| limiter.try_acquire("open")).collect();
    for permit in futures_util::future::join_all(free).await {
        let permit = permit.unwrap();
        assert_eq!(permit.limit(), Limit::Unlimited);
        assert!(!permit.is_counted());
    }
    limiter.set_limit("capped", 1).await.unwrap();
    let _held = limiter.try_acquire("capped").await.unwrap();
    assert!(limiter.try_acquire("capped").await.unwrap_err().is_full());
    assert!(limiter.try_acquire("open").await.is_ok());
}

pub async fn classes_of_keys_have_their_own_limits_and_cap_their_overrides<F: Fixture>(f: F) {
    let limiter = f.limiter(classes());
    let full = |key: &'static str| {
        let limiter = limiter.clone();
        async move { limiter.try_acquire(key).await.unwrap_err().is_full() }
    };
    let app = limiter.try_acquire("app:x").await.unwrap();
    assert_eq!(app.limit(), Limit::Limited(1));
    assert!(full("app:x").await);
    let big: Vec<_> =
        futures_util::future::join_all((0..3).map(|_| limiter.try_acquire("app:big-1")))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
    assert!(full("app:big-1").await, "the more specific rule: 3");
    let tenant = [
        limiter.try_acquire("tenant:t").await.unwrap(),
        limiter.try_acquire("tenant:t").await.unwrap(),
    ];
    assert!(full("tenant:t").await);
    // An override of a key is capped by its class's ceiling.
    let status = limiter.set_limit("tenant:t", 10).await.unwrap();
    assert_eq!(
        (status.limit, status.override_limit),
        (Limit::Limited(3), Some(10))
    );
    let third = limiter.try_acquire("tenant:t").await.unwrap();
    assert!(full("tenant:t").await);
    // A key that no rule matches has the defaults: unlimited, nothing counted.
    let free = limiter.try_acquire("user:1").await.unwrap();
    assert!(!free.is_counted());
    assert_eq!(
        limiter.status("user:1").await.unwrap().limit,
        Limit::Unlimited
    );
    assert_eq!(
        limiter.status("global").await.unwrap().limit,
        Limit::Limited(4)
    );
    assert_eq!(
        limiter.status("app:never").await.unwrap().limit,
        Limit::Limited(1)
    );
    drop((app, big, tenant, third, free));
}

pub async fn a_new_policy_applies_to_the_next_admission_and_held_permits_stay<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(1, 0));
    let other = f.limiter(Policy::new(1, 0));
    let first = limiter.try_acquire("k").await.unwrap();
    assert!(limiter.try_acquire("k").await.unwrap_err().is_full());
    let wider = Policy::new(1, 0).rule("k", ClassLimits::new(3, 0)).unwrap();
    limiter.set_policy(wider);
    let more = [
        limiter.try_acquire("k").await.unwrap(),
        limiter.try_acquire("k").await.unwrap(),
    ];
    assert!(limiter.try_acquire("k").await.unwrap_err().is_full());
    assert!(
        other.try_acquire("k").await.unwrap_err().is_full(),
        "its own policy: 1"
    );
    limiter.set_policy(Policy::new(1, 0));
    assert!(limiter.try_acquire("k").await.unwrap_err().is_full());
    assert_eq!(
        limiter.status("k").await.unwrap().in_flight,
        3,
        "held permits stay held"
    );
    drop((first, more));
    settle(&limiter, "k", 0).await;
    assert!(limiter.try_acquire("k").await.is_ok());
}

pub async fn a_shadow_limit_admits_past_it_and_counts_exactly_the_excess<F: Fixture>(f: F) {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    let shadow = || {
        Policy::new(0, 0)
            .rule("app:*", ClassLimits::new(2, 0))
            .and_then(|p| p.rule("tenant:*", ClassLimits::new(3, 0)))
            .and_then(|p| p.shadow("app:*", true))
            .unwrap()
    };
    let heard = Arc::new(AtomicU32::new(0));
    let counted = heard.clone();
    let limiter = inflight::Limiter::builder(f.store())
        .policy(shadow())
        .on_shadow_refusal(move |key| {
            assert_eq!(key, "app:a");
            counted.fetch_add(1, Ordering::Relaxed);
        })
        .build();
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(
            limiter
                .try_acquire("app:a")
                .await
                .expect("watched, not enforced"),
        );
    }
    assert_eq!(
        limiter.status("app:a").await.unwrap().in_flight,
        5,
        "every one counted"
    );
    assert_eq!(heard.load(Ordering::Relaxed), 3, "exactly the excess");
    assert_eq!(limiter.stats().shadow_refusals.load(Ordering::Relaxed), 3);
    // With an enforced limit beside it, only the enforced one refuses.
    for _ in 0..3 {
        held.push(
            limiter
                .try_acquire_all(&["app:a", "tenant:t"], Default::default())
                .await
                .unwrap(),
        );
    }
    let refused = limiter
        .try_acquire_all(&["app:a", "tenant:t"], Default::default())
        .await
        .unwrap_err();
    assert_eq!(refused.key, "tenant:t");
    assert_eq!(
        heard.load(Ordering::Relaxed),
        6,
        "each admission past the shadow limit, once"
    );
    // Enforced from the next admission on.
    limiter.set_policy(shadow().shadow("app:*", false).unwrap());
    assert!(limiter.try_acquire("app:a").await.unwrap_err().is_full());
    drop(held.pop());
    assert!(limiter.try_acquire("app:b").await.is_ok());
}
