//! Fencing tokens: each admission's grows on its keys, whichever process admits, and a renewal or a
//! release that names an earlier admission of an id never acts on a later admission's lease.

use std::time::Duration;

use inflight::{AcquireOptions, Policy, RemoteLease, Renewal};

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
        let remote = RemoteLease::new(&["app"], lease.id, lease.token);
        assert!(limiter.release(&remote).await.unwrap().0);
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
    let first = RemoteLease::new(&["app"], first.id, first.token);
    assert!(limiter.release(&first).await.unwrap().0);
    let second = admit().await.unwrap().detach();
    assert!(second.token > first.token);
    // The first release again (late, or sent twice): the later admission's lease stays.
    assert!(!limiter.release(&first).await.unwrap().0);
    assert_eq!(limiter.status("app").await.unwrap().in_flight, 1);
    assert!(limiter.try_acquire("app").await.unwrap_err().is_full());
    // Nor does a renewal naming the first admission renew (or re-add) anything.
    assert_eq!(limiter.renew(&first, None).await.unwrap().0, Renewal::Lost);
    let second = RemoteLease::new(&["app"], second.id, second.token);
    let renewed = limiter.renew(&second, None).await.unwrap().0;
    assert!(matches!(renewed, Renewal::Renewed(grant) if grant.token == second.token));
    assert!(limiter.release(&second).await.unwrap().0);
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
    let first = RemoteLease::new(&["app"], first.id, first.token);
    assert!(!one.release(&first).await.unwrap().0);
    assert_eq!(one.status("app").await.unwrap().in_flight, 1);
    // Token 0 names whichever lease the id holds (a caller that knows no token).
    let any = RemoteLease::new(&["app"], second.id, 0);
    assert!(two.release(&any).await.unwrap().0);
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
    let shared = RemoteLease::new(&["app"], "shared", 0);
    assert!(!limiter.release(&shared).await.unwrap().0);
}
