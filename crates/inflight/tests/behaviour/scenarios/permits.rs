//! How a permit is held and let go: dropped or released, by a stream, a scope, through a panic, and
//! from phase to phase.

use futures_util::{stream, StreamExt};
use inflight::Policy;

use super::settle;
use crate::fixtures::Fixture;

pub async fn dropping_or_releasing_a_permit_frees_its_slot<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(1, 0));
    let permit = limiter.try_acquire("app").await.unwrap();
    drop(permit);
    settle(&limiter, "app", 0).await;
    let permit = limiter
        .try_acquire("app")
        .await
        .expect("slot freed by drop");
    permit
        .release()
        .await
        .expect("explicit release reports success");
    assert_eq!(limiter.status("app").await.unwrap().in_flight, 0);
    let _again = limiter
        .try_acquire("app")
        .await
        .expect("slot freed by release");
}

pub async fn a_stream_holds_its_permit_until_it_ends<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(1, 0));
    let permit = limiter.try_acquire("app").await.unwrap();
    let mut s = permit.guard_stream(stream::iter(vec![1, 2, 3]));
    assert_eq!(s.next().await, Some(1));
    assert!(limiter.try_acquire("app").await.unwrap_err().is_full());
    assert_eq!(s.next().await, Some(2));
    assert_eq!(s.next().await, Some(3));
    assert!(
        s.permit().is_some(),
        "held until the stream says it has ended"
    );
    assert_eq!(s.next().await, None);
    assert!(s.permit().is_none());
    settle(&limiter, "app", 0).await;
    assert_eq!(s.next().await, None, "nothing after the end");
}

pub async fn a_stream_dropped_midway_or_before_its_first_item_releases<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(1, 0));
    let permit = limiter.try_acquire("app").await.unwrap();
    let mut s = permit.guard_stream(stream::iter(0..1_000_000));
    assert_eq!(s.next().await, Some(0));
    drop(s); // the client went away
    settle(&limiter, "app", 0).await;

    let permit = limiter.try_acquire("app").await.unwrap();
    let s = permit.guard_stream(stream::pending::<u8>());
    drop(s); // closed before it started
    settle(&limiter, "app", 0).await;
}

pub async fn a_stream_that_errors_releases_when_it_ends<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(1, 0));
    let permit = limiter.try_acquire("app").await.unwrap();
    let items: Vec<Result<u8, &str>> = vec![Ok(1), Err("upstream broke")];
    let collected: Vec<_> = permit.guard_stream(stream::iter(items)).collect().await;
    assert_eq!(collected, vec![Ok(1), Err("upstream broke")]);
    settle(&limiter, "app", 0).await;
}

pub async fn a_scope_holds_its_permit_until_the_future_completes_or_is_cancelled<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(1, 0));
    let permit = limiter.try_acquire("app").await.unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
    let task = tokio::spawn(permit.scope(async move { rx.await.unwrap_or(0) + 1 }));
    tokio::task::yield_now().await;
    assert!(limiter.try_acquire("app").await.unwrap_err().is_full());
    tx.send(41).unwrap();
    assert_eq!(task.await.unwrap(), 42);
    settle(&limiter, "app", 0).await;

    let permit = limiter.try_acquire("app").await.unwrap();
    let task = tokio::spawn(permit.scope(std::future::pending::<()>()));
    tokio::task::yield_now().await;
    task.abort(); // cancellation
    assert!(task.await.unwrap_err().is_cancelled());
    settle(&limiter, "app", 0).await;
}

pub async fn a_panic_while_holding_a_permit_releases_it<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(1, 0));
    let permit = limiter.try_acquire("app").await.unwrap();
    let task = tokio::spawn(async move {
        let _permit = permit;
        panic!("handler bug");
    });
    assert!(task.await.unwrap_err().is_panic());
    settle(&limiter, "app", 0).await;
}

pub async fn one_permit_is_handed_from_phase_to_phase<F: Fixture>(f: F) {
    // The reference system re-entered the same id in its dispatch phase and then deleted it (D5).
    let limiter = f.limiter(Policy::new(1, 0));
    let permit = limiter.try_acquire("workflow").await.unwrap();
    let dispatched = permit.scope(async { "prepared" }).await;
    assert_eq!(dispatched, "prepared");
    settle(&limiter, "workflow", 0).await;
    let permit = limiter.try_acquire("workflow").await.unwrap();
    // Dispatch phase: the permit is held by the caller, then moved into the stream.
    let prepared = async { vec!["a", "b"] }.await;
    let mut s = permit.guard_stream(stream::iter(prepared));
    assert!(
        limiter.try_acquire("workflow").await.is_err(),
        "held through the hand-off"
    );
    while s.next().await.is_some() {}
    settle(&limiter, "workflow", 0).await;
}
