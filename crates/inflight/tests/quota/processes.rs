//! What only processes sharing a real Redis show: a holder killed with SIGKILL loses no credit, and the
//! balance is conserved when several processes reserve and settle at once.

use std::time::Duration;

use inflight::quota::{Fund, Quota, QuotaError, Settlement};
use inflight::{Limiter, Policy, RedisStore};

use crate::support::child::{env, spawn_child, wait_for_line};
use crate::support::TestRedis;

/// What a child process does, by its role; nothing when not started by a test here.
pub fn child() {
    let Ok(role) = std::env::var("INFLIGHT_TEST_CHILD") else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        match role.as_str() {
            "hold" => hold().await,
            "churn" => churn().await,
            other => panic!("unknown child role {other}"),
        }
    });
}

/// Runs three requests charged 2 each to `crashy` whose work never ends, says so, and waits to be
/// killed.
async fn hold() {
    let store = RedisStore::open(env("STORE_URL")).unwrap();
    let ttl = Duration::from_millis(env("TTL_MS").parse().unwrap());
    let quota = Quota::new(store.clone()).with_ttl(ttl);
    let limiter = Limiter::builder(store).policy(Policy::new(3, 0)).build();
    let (started, mut running) = tokio::sync::mpsc::channel(3);
    for _ in 0..3 {
        let (quota, limiter, started) = (quota.clone(), limiter.clone(), started.clone());
        tokio::spawn(async move {
            let work = async move {
                started.send(()).await.unwrap();
                std::future::pending::<Result<(), ()>>().await
            };
            let _ = quota
                .run("crashy", 2, limiter.try_acquire("app:a1"), work)
                .await;
        });
    }
    for _ in 0..3 {
        running.recv().await.unwrap();
    }
    println!("reserved");
    tokio::time::sleep(Duration::from_secs(600)).await;
}

/// 8 tasks reserve, settle at random (commit, refund, drop, abandon) and top up on `hot` `OPS` times
/// each; prints this process's ledger.
async fn churn() {
    let store = RedisStore::open(env("STORE_URL")).unwrap();
    let quota = Quota::new(store).with_ttl(Duration::from_secs(60));
    let (ops, seed): (u64, u64) = (env("OPS").parse().unwrap(), env("SEED").parse().unwrap());
    let tasks: Vec<_> = (0..8u64)
        .map(|task| {
            let quota = quota.clone();
            tokio::spawn(async move {
                let mut state = seed * 1_000 + task + 1;
                let mut next = move |n: u64| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (state >> 33) % n
                };
                let (mut committed, mut funded) = (0, 0);
                for _ in 0..ops {
                    let reservation = match quota.reserve("hot", 1 + next(4)).await {
                        Ok(reservation) => reservation,
                        Err(QuotaError::Exhausted { .. }) => {
                            let amount = 1 + next(8);
                            quota.fund("hot", Fund::Add(amount)).await.unwrap();
                            funded += amount;
                            continue;
                        }
                        Err(other) => panic!("{other}"),
                    };
                    let amount = reservation.amount();
                    match next(4) {
                        0 => {
                            if let Settlement::Settled(_) = reservation.commit().await.unwrap() {
                                committed += amount;
                            }
                        }
                        1 => drop(reservation.refund().await.unwrap()),
                        2 => drop(reservation),
                        _ => drop(reservation.detach()),
                    }
                }
                (committed, funded)
            })
        })
        .collect();
    let (mut committed, mut funded) = (0, 0);
    for task in tasks {
        let (c, f) = task.await.unwrap();
        committed += c;
        funded += f;
    }
    println!("\nledger committed={committed} funded={funded}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_reservations_are_refunded_within_their_ttl() {
    let redis = TestRedis::start();
    let store = redis.store();
    let quota = Quota::new(store.clone());
    quota.fund("crashy", Fund::Set(10)).await.unwrap();
    let ttl = Duration::from_secs(30);
    let mut child = spawn_child(
        "hold",
        &[
            ("STORE_URL", redis.url()),
            ("TTL_MS", ttl.as_millis().to_string()),
        ],
    );
    wait_for_line(&mut child, "reserved");
    child.kill().unwrap(); // SIGKILL: no refund, no goodbye
    child.wait().unwrap();
    let held = quota.balance("crashy").await.unwrap().unwrap();
    assert_eq!(
        (held.balance, held.reserved),
        (4, 6),
        "held by the dead process"
    );
    // (This handle's clock, moved forward: the store refunds by the Redis clock.)
    // (Five seconds short of it: Redis's clock has moved on since the child reserved.)
    store.advance_clock(ttl - Duration::from_secs(5));
    let held = quota.balance("crashy").await.unwrap().unwrap();
    assert_eq!(held.reserved, 6, "held until the ttl passes");
    store.advance_clock(Duration::from_secs(5));
    let back = quota.balance("crashy").await.unwrap().unwrap();
    assert_eq!((back.balance, back.reserved, back.expired), (10, 0, 3));
}

#[test]
fn balance_is_conserved_across_processes_against_an_independent_ledger() {
    const START: u64 = 200;
    let redis = TestRedis::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = rt.block_on(async { redis.store() });
    // (A quota's limiter runs its background work on the runtime it is made in.)
    let quota = rt.block_on(async { Quota::new(store.clone()) });
    rt.block_on(quota.fund("hot", Fund::Set(START))).unwrap();
    let children: Vec<_> = (0..3u64)
        .map(|seed| {
            spawn_child(
                "churn",
                &[
                    ("STORE_URL", redis.url()),
                    ("OPS", "60".into()),
                    ("SEED", seed.to_string()),
                ],
            )
        })
        .collect();
    let (mut committed, mut funded) = (0u64, START);
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "child failed: {:?}", out.status);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let ledger = stdout
            .lines()
            .find_map(|line| line.strip_prefix("ledger "))
            .unwrap_or_else(|| panic!("no ledger in the child's output: {stdout}"));
        for term in ledger.split(' ') {
            let (name, n) = term.split_once('=').unwrap();
            let n: u64 = n.parse().unwrap();
            match name {
                "committed" => committed += n,
                "funded" => funded += n,
                other => panic!("{other}"),
            }
        }
    }
    // Whatever the children abandoned, or left refunding in the background as they exited, expires.
    store.advance_clock(Duration::from_secs(61));
    let end = rt.block_on(quota.balance("hot")).unwrap().unwrap();
    eprintln!("funded {funded}, committed {committed}, end {end:?}");
    assert!(
        committed > 0 && funded > START,
        "the load spent and topped up"
    );
    assert_eq!((end.balance, end.reserved), (funded - committed, 0));
}
