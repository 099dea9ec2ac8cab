//! One queue for every process: arrival order, flows in turn, priorities, no barging, floors, and a
//! ticket abandoned by its waiter.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use inflight::{AcquireError, AcquireOptions, Limiter, MemoryStore, Policy, Wakeups};

use crate::support::TestRedis;
use crate::{limiter, memory, redis, wait, waiting};

/// A waiter's ask on `model` (limit 1) straight to the store, under `id` (`generated` for it), with the
/// ticket `name` of `flow`, leased for `ticket_ms`, that a release may hand the slot to (`handoff`).
async fn ask_store<S: Wakeups>(
    store: &S,
    (id, generated): (&inflight::PermitId, bool),
    (name, flow, ticket_ms): (&str, &str, u64),
    handoff: bool,
) -> Result<inflight::store::Admission, inflight::StoreError> {
    let limits = [inflight::ClassLimits::new(1, 0)];
    let request = inflight::store::AcquireRequest {
        keys: &["model"],
        id,
        weight: 1,
        lease_ms: 30_000,
        limits: &limits,
        generated,
        ticket: Some(inflight::store::Ticket {
            name,
            flow,
            flow_weight: 1,
            lease_ms: ticket_ms,
            handoff,
        }),
        priority: 0,
        floors: &[],
        holder: None,
        shadow: 0,
    };
    store.acquire(request).await
}

/// Waits (bounded) until the two limiters have `n` admissions waiting between them.
async fn waiting_in_both<S: Wakeups>(a: &Limiter<S>, b: &Limiter<S>, n: u64) {
    let count = |l: &Limiter<S>| l.stats().waiting.load(Ordering::SeqCst);
    for _ in 0..2000 {
        if count(a) + count(b) == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("never {n} waiting");
}

/// Limit 1, held; then waiters queue in turn from both "processes", each with `options(n)`, named
/// `name(n)`; the release admits them one by one: the names in the order admitted.
async fn admission_order<S: Wakeups>(
    (a, b): (S, S),
    count: usize,
    options: impl Fn(usize) -> AcquireOptions,
    name: impl Fn(usize) -> String,
) -> Vec<String> {
    let handles = [limiter(a, 1), limiter(b, 1)];
    let held = handles[0].try_acquire("model").await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for n in 0..count {
        let (waiter, order, name) = (handles[n % 2].clone(), order.clone(), name(n));
        let options = options(n).max_wait(Duration::from_secs(60));
        tasks.push(tokio::spawn(async move {
            let permit = waiter.acquire("model", options).await.unwrap();
            order.lock().unwrap().push(name);
            permit.release().await.unwrap();
        }));
        waiting_in_both(&handles[0], &handles[1], n as u64 + 1).await;
    }
    held.release().await.unwrap();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("every waiter admitted")
            .unwrap();
    }
    let order = order.lock().unwrap().clone();
    order
}

/// One queue for both processes: arrival order whichever process a waiter is in; a flow with one
/// waiter is admitted within two admissions of another flow's many; a higher priority passes them all.
async fn one_queue_for_every_process<S: Wakeups>(stores: impl Fn() -> (S, S)) {
    let order = admission_order(stores(), 8, |_| AcquireOptions::new(), |n| n.to_string());
    let expected: Vec<String> = (0..8).map(|n| n.to_string()).collect();
    assert_eq!(order.await, expected, "arrival order across processes");
    let flows = |n| AcquireOptions::new().flow(if n == 30 { "b" } else { "a" });
    let order = admission_order(stores(), 31, flows, |n| n.to_string()).await;
    let b = order.iter().position(|name| name == "30").unwrap();
    assert!(b < 2, "flow b admitted after {b} of flow a's 30");
    // Flow a of weight 3 and flow b of weight 1, twelve waiters each: three of a's to one of b's.
    let weighted = |n: usize| match n % 2 {
        0 => AcquireOptions::new().flow("a").flow_weight(3),
        _ => AcquireOptions::new().flow("b"),
    };
    let name = |n: usize| if n % 2 == 0 { "a" } else { "b" }.to_owned();
    let order = admission_order(stores(), 24, weighted, name).await;
    for (n, rounds) in [(8, 2), (16, 4)] {
        let b = order[..n].iter().filter(|name| *name == "b").count();
        assert_eq!(b, rounds, "one of b's to three of a's a round: {order:?}");
    }
    let levels = |n| AcquireOptions::new().priority(if n == 5 { 9 } else { 0 });
    let order = admission_order(stores(), 6, levels, |n| n.to_string()).await;
    assert_eq!(
        order,
        ["5", "0", "1", "2", "3", "4"],
        "the high priority first"
    );
}

/// No barging: with limit 2, a waiter of weight 2 queues; one slot given back is too few for it, yet
/// it is kept: a request of weight 1 without a wait, in the other process, is refused.
async fn a_request_without_a_wait_does_not_pass_the_queue<S: Wakeups>((a, b): (S, S)) {
    let (holder, other) = (limiter(a, 2), limiter(b, 2));
    let first = holder.try_acquire("model").await.unwrap();
    let second = holder.try_acquire("model").await.unwrap();
    let waiter = {
        let other = other.clone();
        tokio::spawn(async move { other.acquire("model", wait(60_000).weight(2)).await })
    };
    waiting(&other, 1).await;
    first.release().await.unwrap();
    let refused = other.try_acquire("model").await.unwrap_err();
    assert!(matches!(refused, AcquireError::Full { .. }), "{refused:?}");
    second.release().await.unwrap();
    let admitted = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the waiter admitted")
        .unwrap()
        .unwrap();
    assert_eq!(admitted.weight(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_a_request_without_a_wait_does_not_pass_the_queue() {
    a_request_without_a_wait_does_not_pass_the_queue(memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_request_without_a_wait_does_not_pass_the_queue() {
    let (a, b, _server) = redis();
    a_request_without_a_wait_does_not_pass_the_queue((a, b)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_one_queue_for_every_process() {
    one_queue_for_every_process(memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_one_queue_for_every_process() {
    let server = TestRedis::start();
    one_queue_for_every_process(|| (server.store(), server.store())).await;
}

/// Dify's layout: one queue beside Dify's hash for every process, in the same order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dify_one_queue_for_every_process() {
    let server = TestRedis::start();
    let open = || server.store_builder().dify().open().unwrap();
    one_queue_for_every_process(|| (open(), open())).await;
}

/// Limit 10 and a floor of 4 for priority 9: a low flood takes all 10 while the high level is idle;
/// once it has demand, the low level holds at most 6 (it gives slots back by not being admitted
/// again, never by preemption); idle again, the low level takes all 10.
async fn floors_keep_slots_for_a_busy_level<S: Wakeups>((a, b): (S, S)) {
    let policy = || {
        Policy::new(10, 0)
            .floors(None, inflight::Floors::new(&[(9, 4)]).unwrap())
            .unwrap()
    };
    let low = Limiter::builder(a).policy(policy()).build();
    let high = Limiter::builder(b).policy(policy()).build();
    let mut lows = Vec::new();
    for _ in 0..10 {
        lows.push(
            low.try_acquire("model")
                .await
                .expect("the high level idle: all 10"),
        );
    }
    // The high level's demand: a waiter, admitted by the first slot given back.
    let high_waiter = {
        let high = high.clone();
        tokio::spawn(async move {
            high.acquire("model", wait(60_000).priority(9))
                .await
                .unwrap()
        })
    };
    waiting(&high, 1).await;
    lows.pop().unwrap().release().await.unwrap();
    let high_permit = tokio::time::timeout(Duration::from_secs(30), high_waiter)
        .await
        .expect("the high waiter admitted")
        .unwrap();
    // A low flood waits; the low holders go one by one: the low level never holds more than 6.
    let held_low = Arc::new(AtomicUsize::new(lows.len()));
    let most_low = Arc::new(AtomicUsize::new(0));
    let (give_back, _) = tokio::sync::broadcast::channel::<()>(1);
    let mut flood = Vec::new();
    for _ in 0..12 {
        let (low, held_low, most_low) = (low.clone(), held_low.clone(), most_low.clone());
        let mut released = give_back.subscribe();
        flood.push(tokio::spawn(async move {
            let permit = low.acquire("model", wait(60_000)).await.unwrap();
            let now = held_low.fetch_add(1, Ordering::SeqCst) + 1;
            most_low.fetch_max(now, Ordering::SeqCst);
            let _ = released.recv().await;
            held_low.fetch_sub(1, Ordering::SeqCst);
            permit.release().await.unwrap();
        }));
    }
    waiting(&low, 12).await;
    while let Some(permit) = lows.pop() {
        held_low.fetch_sub(1, Ordering::SeqCst);
        permit.release().await.unwrap();
    }
    // Admitted up to 6 (10 - the high's 1 - the 3 more its floor keeps), then no more.
    for _ in 0..2000 {
        if held_low.load(Ordering::SeqCst) == 6 && low.stats().waiting.load(Ordering::SeqCst) == 6 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(held_low.load(Ordering::SeqCst), 6, "the low level holds 6");
    assert_eq!(
        most_low.load(Ordering::SeqCst),
        6,
        "never more while the high level has demand"
    );
    assert_eq!(low.status("model").await.unwrap().in_flight, 7);
    // The high level idle again: the low waiters take all 10.
    high_permit.release().await.unwrap();
    waiting(&low, 2).await;
    for _ in 0..2000 {
        if held_low.load(Ordering::SeqCst) == 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        held_low.load(Ordering::SeqCst),
        10,
        "the high level idle: the low holds all 10"
    );
    let _ = give_back.send(());
    for task in flood {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("every waiter done")
            .unwrap();
    }
    assert_eq!(low.status("model").await.unwrap().in_flight, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_floors_keep_slots_for_a_busy_level() {
    floors_keep_slots_for_a_busy_level(memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_floors_keep_slots_for_a_busy_level() {
    let (a, b, _server) = redis();
    floors_keep_slots_for_a_busy_level((a, b)).await;
}

/// A ticket whose waiter stops asking (its process killed or paused) holds its place for one ticket
/// lease: until then a request without a ticket is refused behind it; after, the first admission that
/// meets it drops it and counts it (`Wakeups::tickets_expired`).
async fn an_abandoned_ticket_expires_after_its_lease<S: Wakeups>(
    store: S,
    advance: impl Fn(Duration),
) {
    use inflight::store::Admission;
    let limiter = limiter(store.clone(), 1);
    let held = limiter.try_acquire("model").await.unwrap();
    let turn = store.ticket().expect("a store with queues");
    let id = inflight::PermitId::generate();
    let ticket = (turn.name(), "", inflight::TICKET_LEASE_MS);
    let queued = ask_store(&store, (&id, true), ticket, false).await.unwrap();
    assert!(matches!(queued, Admission::Queued { .. }), "{queued:?}");
    held.release().await.unwrap();
    // Its place is kept while its lease lasts, though no one asks.
    assert!(limiter.try_acquire("model").await.is_err());
    assert_eq!(store.tickets_expired(), 0);
    advance(Duration::from_millis(inflight::TICKET_LEASE_MS + 1));
    drop(
        limiter
            .try_acquire("model")
            .await
            .expect("the dead ticket dropped"),
    );
    assert_eq!(store.tickets_expired(), 1);
}

#[tokio::test]
async fn memory_an_abandoned_ticket_expires_after_its_lease() {
    let clock = inflight::ManualClock::new(1_000_000);
    let store = MemoryStore::with_clock(clock.clone());
    an_abandoned_ticket_expires_after_its_lease(store, |by| clock.advance(by)).await;
}

#[tokio::test]
async fn redis_an_abandoned_ticket_expires_after_its_lease() {
    let server = TestRedis::start();
    let store = server.store();
    let clock = store.clone();
    an_abandoned_ticket_expires_after_its_lease(store, |by| clock.advance_clock(by)).await;
}

/// Flows come and go on a key whose queue never empties: those that left do not fill its bound of
/// flows (1,000), so a new flow still takes a ticket after 1,100 others have come and gone.
async fn flows_that_left_do_not_fill_the_bound<S: Wakeups>(store: S) {
    use inflight::store::Admission;
    let limiter = limiter(store.clone(), 1);
    let _held = limiter.try_acquire("model").await.unwrap();
    let stays = store.ticket().unwrap();
    let ask = |name: &str, flow: &str| {
        let (store, id) = (store.clone(), inflight::PermitId::generate());
        let (name, flow) = (name.to_owned(), flow.to_owned());
        async move { ask_store(&store, (&id, true), (&name, &flow, 60_000), false).await }
    };
    // One waiter stays queued throughout.
    let queued = ask(stays.name(), "stays").await.unwrap();
    assert!(matches!(queued, Admission::Queued { .. }), "{queued:?}");
    let keys = [std::sync::Arc::<str>::from("model")];
    for n in 0..1100 {
        let turn = store.ticket().unwrap();
        let asked = ask(turn.name(), &format!("flow-{n}")).await;
        assert!(
            matches!(asked, Ok(Admission::Queued { .. })),
            "flow {n}: {asked:?}"
        );
        assert!(store.leave(&keys, turn.name(), None).await.unwrap());
    }
}

#[tokio::test]
async fn memory_flows_that_left_do_not_fill_the_bound() {
    flows_that_left_do_not_fill_the_bound(MemoryStore::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_flows_that_left_do_not_fill_the_bound() {
    let server = TestRedis::start();
    flows_that_left_do_not_fill_the_bound(server.store()).await;
}

/// A release hands the freed slot to the head waiter in its own step: the slot is the waiter's as soon
/// as the release has returned (before, it stayed free until the waiter's process heard and asked
/// again), and the waiter, in another process, holds it without asking. Leased at first for as long as
/// its ticket would have lasted, the lease is then claimed for its own length.
async fn a_release_hands_the_slot_to_the_head_waiter<S: Wakeups>((a, b): (S, S)) {
    let (holder, other) = (limiter(a, 1), limiter(b, 1));
    let held = holder.try_acquire("model").await.unwrap();
    let waiter = {
        let other = other.clone();
        tokio::spawn(async move { other.acquire("model", wait(60_000)).await })
    };
    waiting(&other, 1).await;
    held.release().await.unwrap();
    let status = holder.status("model").await.unwrap();
    assert_eq!(status.in_flight, 1, "the waiter's already");
    let permit = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("admitted")
        .unwrap()
        .unwrap();
    assert!(permit.token() > 0);
    // (Both stores' clocks are this machine's.)
    let left = || {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        let now = u64::try_from(now.unwrap().as_millis()).unwrap();
        permit.expires_at_ms().saturating_sub(now)
    };
    // (Within the ticket's lease, which the handed lease lasts unclaimed: the renewal task alone would
    // come a third of the way through 30 s, too late.)
    for _ in 0..inflight::TICKET_LEASE_MS / 5 {
        if left() > inflight::TICKET_LEASE_MS + 5_000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        left() > inflight::TICKET_LEASE_MS + 5_000,
        "claimed for the limiter's 30 s lease: {} ms left",
        left()
    );
    permit.release().await.unwrap();
    assert_eq!(holder.status("model").await.unwrap().in_flight, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_a_release_hands_the_slot_to_the_head_waiter() {
    a_release_hands_the_slot_to_the_head_waiter(memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_release_hands_the_slot_to_the_head_waiter() {
    let (a, b, _server) = redis();
    a_release_hands_the_slot_to_the_head_waiter((a, b)).await;
}

/// A waiter gone (its future dropped) between the release that handed it the slot and hearing of it:
/// its leave gives the slot back, so nothing stays held.
#[tokio::test]
async fn memory_a_slot_handed_to_a_waiter_gone_before_hearing_is_given_back() {
    let (a, b) = memory();
    let (holder, other) = (limiter(a, 1), limiter(b, 1));
    let held = holder.try_acquire("model").await.unwrap();
    let waiter = {
        let other = other.clone();
        tokio::spawn(async move { other.acquire("model", wait(60_000)).await })
    };
    waiting(&other, 1).await;
    // (One thread: the waiter's task does not run between the release and its abort.)
    held.release().await.unwrap();
    assert_eq!(holder.status("model").await.unwrap().in_flight, 1, "handed");
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    for _ in 0..400 {
        if holder.status("model").await.unwrap().in_flight == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the handed slot was not given back");
}

/// An ask of a waiter that reaches Redis after the waiter gave up its ticket (redis-rs sends a batch
/// again after a NOSCRIPT, behind commands sent since; a slow link can delay it too) takes no place: the
/// ticket stays given up, so no release hands a slot to a waiter that is gone (it would hold it for a
/// ticket's lease) and no dead ticket holds the head. Before, both happened now and then in
/// `redis_dropped_waiters_hold_nothing`, whose first batch met a NOSCRIPT.
#[tokio::test]
async fn redis_an_ask_that_arrives_after_its_leave_takes_no_place() {
    use inflight::store::Admission;
    let server = TestRedis::start();
    let store = server.store();
    let limiter = limiter(store.clone(), 1);
    let held = limiter.try_acquire("model").await.unwrap();
    let turn = store.ticket().expect("a store with queues");
    let id = inflight::PermitId::generate();
    let keys = [std::sync::Arc::from("model")];
    assert!(!store.leave(&keys, turn.name(), Some(&id)).await.unwrap());
    let late = (turn.name(), "", inflight::TICKET_LEASE_MS);
    let answer = ask_store(&store, (&id, false), late, true).await.unwrap();
    assert!(matches!(answer, Admission::Queued { .. }), "{answer:?}");
    let queue: usize = redis::cmd("ZCARD")
        .arg("inflight:{model}:queue")
        .query(&mut server.client())
        .unwrap();
    assert_eq!(queue, 0, "no place taken");
    held.release().await.unwrap();
    assert_eq!(
        limiter.status("model").await.unwrap().in_flight,
        0,
        "nothing handed"
    );
    drop(limiter.try_acquire("model").await.expect("no dead head"));
}

/// A waiter's admission registered for a hand-off follows its asks: after the class limit is lowered
/// (the waiter asks again when the policy changes), a release hands it no slot past the new limit.
/// Before, the first ask's limits stayed with the ticket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_hand_off_follows_a_lowered_limit() {
    let (a, b, server) = redis();
    let (holder, other) = (limiter(a, 2), limiter(b, 2));
    let (first, second) = (
        holder.try_acquire("model").await.unwrap(),
        holder.try_acquire("model").await.unwrap(),
    );
    let waiter = {
        let other = other.clone();
        tokio::spawn(async move { other.acquire("model", wait(5_000)).await })
    };
    waiting(&other, 1).await;
    other.set_policy(Policy::new(1, 0));
    holder.set_policy(Policy::new(1, 0));
    // The registered terms ('weight lease default max') once the waiter has asked under the new limit.
    let registered = || -> Vec<String> {
        // (The '>' fields hold the waiter's id, bytes that are not UTF-8.)
        let all: Vec<Vec<u8>> = redis::cmd("HGETALL")
            .arg("inflight:{model}:tickets")
            .query(&mut server.client())
            .unwrap();
        let fields = all.chunks(2).filter(|kv| kv[0].starts_with(b"+"));
        fields
            .map(|kv| String::from_utf8_lossy(&kv[1]).into_owned())
            .collect()
    };
    for _ in 0..400 {
        if registered() == ["1 3000 1 0"] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(registered(), ["1 3000 1 0"]);
    first.release().await.unwrap();
    assert_eq!(
        holder.status("model").await.unwrap().in_flight,
        1,
        "nothing handed"
    );
    second.release().await.unwrap();
    let permit = waiter.await.unwrap().expect("admitted under the new limit");
    assert_eq!(holder.status("model").await.unwrap().in_flight, 1);
    drop(permit);
}
