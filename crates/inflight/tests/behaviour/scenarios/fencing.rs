//! Fencing tokens: each admission's grows on its keys, whichever process admits, and a renewal or a
//! release that names an earlier admission of an id never acts on a later admission's lease.

use std::sync::Arc;
use std::time::Duration;

use inflight::{AcquireOptions, PermitId, Policy, Renewal};

use crate::fixtures::Fixture;

pub async fn tokens_grow_with_every_admission_on_a_key<F: Fixture>(f: F) {
    // Two processes on one store, taking turns; a permit dropped, a lease handed out, an id held again.
    let (one, two) = (f.limiter(Policy::new(2, 0)), f.limiter(Policy::new(2, 0)));
    let mut last = 0;
    for round in 0..6 {
        let limiter = if round % 2 == 0 { &one } else { &two };
        let permit = limiter.try_acquire("app").await.unwrap();
        assert!(permit.token() > last, "{} after {last}", permit.token());
        last = permit.token();
        let lease = permit.detach();
        assert_eq!(lease.token, last, "a lease handed out keeps its token");
        assert!(limiter
            .release("app", &lease.id, lease.token)
            .await
            .unwrap());
    }
    // A permit on several keys: larger than every token of each.
    let both = one
        .try_acquire_all(&["app", "other"], AcquireOptions::new())
        .await
        .unwrap();
    assert!(both.token() > last);
    let alone = two.try_acquire("other").await.unwrap();
    assert!(alone.token() > both.token());
}

pub async fn a_late_release_of_an_earlier_admission_leaves_a_later_ones_lease<F: Fixture>(f: F) {
    // The first finding: a release sent again after a timeout arrives after the same id was
    // admitted again; it removed that lease, and a key of limit 1 admitted a second permit.
    let limiter = f.limiter(Policy::new(1, 0));
    let admit = || limiter.try_acquire_with("app", AcquireOptions::new().id("job-7"));
    let first = admit().await.unwrap().detach();
    assert!(limiter
        .release("app", &first.id, first.token)
        .await
        .unwrap());
    let second = admit().await.unwrap().detach();
    assert!(second.token > first.token);
    // The first release again (late, or sent twice): the later admission's lease stays.
    assert!(!limiter
        .release("app", &first.id, first.token)
        .await
        .unwrap());
    assert_eq!(limiter.status("app").await.unwrap().in_flight, 1);
    assert!(limiter.try_acquire("app").await.unwrap_err().is_full());
    // Nor does a renewal naming the first admission renew (or re-add) anything.
    let renewal = limiter.renew("app", &first.id, first.token, None).await;
    assert_eq!(renewal.unwrap(), Renewal::Lost);
    let renewed = limiter.renew("app", &second.id, second.token, None).await;
    assert!(matches!(renewed.unwrap(), Renewal::Renewed(grant) if grant.token == second.token));
    assert!(limiter
        .release("app", &second.id, second.token)
        .await
        .unwrap());
    assert_eq!(limiter.status("app").await.unwrap().in_flight, 0);
}

pub async fn a_later_admission_of_an_id_takes_its_lease_over<F: Fixture>(f: F) {
    // Two processes admit one given id (one request, retried through another worker): one slot, named
    // by the later admission's token; the earlier holder's release leaves it.
    let (one, two) = (f.limiter(Policy::new(1, 0)), f.limiter(Policy::new(1, 0)));
    let options = || {
        AcquireOptions::new()
            .id("request-1")
            .lease(Duration::from_secs(10))
    };
    let first = one
        .try_acquire_with("app", options())
        .await
        .unwrap()
        .detach();
    let second = two
        .try_acquire_with("app", options())
        .await
        .unwrap()
        .detach();
    assert_eq!(second.in_flight, 1, "the same id counts once");
    assert!(second.token > first.token);
    assert!(!one.release("app", &first.id, first.token).await.unwrap());
    assert_eq!(one.status("app").await.unwrap().in_flight, 1);
    // Token 0 names whichever lease the id holds (a caller that knows no token).
    assert!(two.release("app", &second.id, 0).await.unwrap());
    assert_eq!(one.status("app").await.unwrap().in_flight, 0);
}

pub async fn in_process_permits_of_one_id_release_with_the_latest_token<F: Fixture>(f: F) {
    // Two permits of this process under one id share the lease; the later admission's token names it,
    // so the last permit to go releases it, whichever that is.
    let limiter = f.limiter(Policy::new(1, 0));
    let options = || AcquireOptions::new().id("shared");
    let first = limiter.try_acquire_with("app", options()).await.unwrap();
    let second = limiter.try_acquire_with("app", options()).await.unwrap();
    assert_eq!(first.token(), second.token(), "one lease, one token");
    drop(second);
    first.release().await.unwrap();
    assert_eq!(limiter.status("app").await.unwrap().in_flight, 0);
    let keys: Arc<[Arc<str>]> = Arc::from([Arc::from("app")]);
    assert!(!limiter
        .release_all(&keys, &PermitId::from("shared"), 0)
        .await
        .unwrap());
}
