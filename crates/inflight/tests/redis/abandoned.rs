//! An admission under a given id abandoned while Redis decides (a timeout wrapped around `try_acquire`
//! or `acquire`): the decision is finished in the background and the lease it made is given back, not
//! held until its deadline.

use std::time::Duration;

use inflight::{AcquireOptions, Limiter, Policy};

use crate::support::TestRedis;

async fn abandoned_admissions_give_their_slot_back(wait: bool) {
    let redis = TestRedis::start();
    // Redis's answer, late as it is, is waited for (a store that gave up on it could not tell whether
    // the admission was made).
    let store = redis
        .store_builder()
        .response_timeout(Duration::from_secs(30))
        .open()
        .unwrap();
    let limiter = Limiter::builder(store).policy(Policy::new(1, 0)).build();
    limiter.status("k").await.unwrap(); // connected
    let mut c = redis.client();
    // Redis answers nobody for a while: the admission is sent, then its caller gives up.
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(500)
        .query(&mut c)
        .unwrap();
    let mut options = AcquireOptions::new().id("job-1");
    if wait {
        options = options.max_wait(Duration::from_secs(30));
    }
    let abandoned =
        tokio::time::timeout(Duration::from_millis(100), limiter.acquire("k", options)).await;
    assert!(abandoned.is_err(), "the caller gave up first");
    // Once Redis answers, the admission is made, then given back (its deadline is 30 s away).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let last: Option<String> = redis::cmd("HGET")
            .arg("inflight:{k}:permits")
            .arg("#")
            .query(&mut c)
            .unwrap();
        let in_flight = limiter.status("k").await.unwrap().in_flight;
        if last.is_some() && in_flight == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "admitted: {}, in flight: {in_flight}",
            last.is_some()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let permit = limiter.try_acquire("k").await.unwrap();
    drop(permit);
}

#[tokio::test]
async fn an_abandoned_try_acquire_under_a_given_id_gives_its_slot_back() {
    abandoned_admissions_give_their_slot_back(false).await;
}

#[tokio::test]
async fn an_abandoned_wait_under_a_given_id_gives_its_slot_back() {
    abandoned_admissions_give_their_slot_back(true).await;
}
