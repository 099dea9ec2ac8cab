//! On Redis, the view of the keys with a balance: a reservation on an unmetered key costs no round trip
//! once the view has read the index; a key funded through another handle (another process) is metered
//! here within moments; and the index holds at most `MAX_QUOTAS` keys.

use std::time::{Duration, Instant};

use inflight::quota::{Fund, Quota, QuotaError, MAX_QUOTAS};
use inflight::StoreError;

use crate::support::TestRedis;

/// Runs `check` until it is true, for at most 5 s; panics with `what` otherwise.
async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !check().await {
        assert!(Instant::now() < deadline, "not within 5 s: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmetered_reservations_cost_no_round_trip_and_a_funded_key_is_seen_soon() {
    let server = TestRedis::start();
    let here = Quota::new(server.store());
    let elsewhere = Quota::new(server.store());

    // The first reservation starts the view; once it has read the index, a round of them runs no script.
    eventually(
        "reservations on an unmetered key run no script",
        async || {
            let before = server.scripts_run();
            for _ in 0..50 {
                assert!(!here.reserve("free:f1", 1).await.unwrap().is_metered());
            }
            server.scripts_run() == before
        },
    )
    .await;

    // Funded through another handle: metered here once the announcement arrives.
    elsewhere.fund("tenant:t1", Fund::Set(5)).await.unwrap();
    eventually("a key funded elsewhere is metered here", async || {
        let reservation = here.reserve("tenant:t1", 1).await.unwrap();
        let metered = reservation.is_metered();
        reservation.refund().await.unwrap();
        metered
    })
    .await;
    let balance = elsewhere.balance("tenant:t1").await.unwrap().unwrap();
    assert_eq!((balance.balance, balance.reserved), (5, 0));

    // Funded through this handle: metered at once.
    here.fund("tenant:t2", Fund::Set(1)).await.unwrap();
    let reservation = here.reserve("tenant:t2", 1).await.unwrap();
    assert!(reservation.is_metered());
    assert!(here
        .reserve("tenant:t2", 1)
        .await
        .unwrap_err()
        .is_exhausted());
    reservation.commit().await.unwrap();

    // Settling and reading a balance always ask Redis, so a handle that never reserved sees them.
    let fresh = Quota::new(server.store());
    let balance = fresh.balance("tenant:t2").await.unwrap().unwrap();
    assert_eq!((balance.balance, balance.reserved), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_of_metered_keys_is_bounded() {
    let server = TestRedis::start();
    let mut conn = server.client();
    let quota = Quota::new(server.store());
    quota.fund("tenant:kept", Fund::Set(1)).await.unwrap();
    // Fill the index to its bound directly (funding that many keys would take minutes).
    let mut pipe = redis::pipe();
    for chunk in (1..MAX_QUOTAS).collect::<Vec<_>>().chunks(4096) {
        let mut hset = redis::cmd("HSET");
        hset.arg("inflight:quotas");
        for i in chunk {
            hset.arg(format!("filler:{i}")).arg(1);
        }
        pipe.add_command(hset).ignore();
    }
    let () = pipe.query(&mut conn).unwrap();

    let refused = quota.fund("tenant:new", Fund::Set(1)).await.unwrap_err();
    let bound = StoreError::TooManyQuotas { max: MAX_QUOTAS };
    assert_eq!(refused, QuotaError::Store(bound));
    assert_eq!(
        quota.balance("tenant:new").await.unwrap(),
        None,
        "nothing set"
    );
    // A key already in the index may still be funded.
    let balance = quota.fund("tenant:kept", Fund::Add(2)).await.unwrap();
    assert_eq!(balance.balance, 3);
}
