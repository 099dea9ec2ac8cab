//! Many processes on one key: child processes of this test binary that hammer a key or hold permits
//! until they are killed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use inflight::{AcquireError, Limiter, Policy, RedisStore};

use crate::support::child::{env, spawn_child, wait_for_line};
use crate::support::TestRedis;
use crate::{timing_sensitive, whole_machine};

/// 64 tasks admit on one key until this process has `ADMISSIONS` admissions, recording each admitted
/// request in an independent probe (a counter on another Redis): +1 after admission, -1 before release.
pub(crate) async fn hammer() {
    let limit: u32 = env("LIMIT").parse().unwrap();
    let admissions: u64 = env("ADMISSIONS").parse().unwrap();
    let store = RedisStore::open(env("STORE_URL")).unwrap();
    let limiter = Limiter::builder(store)
        .policy(Policy::new(limit, 0))
        .build();
    let probe = redis::Client::open(env("PROBE_URL"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let enter = redis::Script::new(
        "local n = redis.call('INCR', KEYS[1]) \
         if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end \
         return n",
    );
    let enter = Arc::new(enter);
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (limiter, mut probe, enter, admitted) = (
            limiter.clone(),
            probe.clone(),
            enter.clone(),
            admitted.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while admitted.load(Ordering::Relaxed) < admissions {
                match limiter.try_acquire("hot").await {
                    Ok(permit) => {
                        admitted.fetch_add(1, Ordering::Relaxed);
                        let _: i64 = enter
                            .key("probe")
                            .key("probe_max")
                            .invoke_async(&mut probe)
                            .await
                            .unwrap();
                        let _: i64 = redis::cmd("DECR")
                            .arg("probe")
                            .query_async(&mut probe)
                            .await
                            .unwrap();
                        permit.release().await.unwrap();
                    }
                    // Full: back off a little, as a client given Retry-After would (and leave Redis to the rest).
                    Err(AcquireError::Full { .. }) => {
                        tokio::time::sleep(Duration::from_millis(1)).await
                    }
                    Err(other) => panic!("admission failed: {other}"),
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    println!("\nadmitted={}", admitted.load(Ordering::Relaxed));
}

/// Holds `COUNT` permits with a `LEASE_MS` lease, says so, and waits to be killed.
pub(crate) async fn hold() {
    let count: usize = env("COUNT").parse().unwrap();
    let lease = Duration::from_millis(env("LEASE_MS").parse().unwrap());
    let store = RedisStore::open(env("STORE_URL")).unwrap();
    let limiter = Limiter::builder(store)
        .policy(Policy::new(count as u32, 0))
        .lease(lease)
        .build();
    let mut permits = Vec::new();
    for _ in 0..count {
        permits.push(limiter.try_acquire("crashy").await.unwrap());
    }
    println!("held");
    tokio::time::sleep(Duration::from_secs(600)).await;
    drop(permits);
}

fn run_hammer(limit: u32, processes: usize, admissions_each: u64) {
    let _machine = whole_machine();
    let store = TestRedis::start();
    let probe = TestRedis::start();
    let children: Vec<_> = (0..processes)
        .map(|_| {
            spawn_child(
                "hammer",
                &[
                    ("LIMIT", limit.to_string()),
                    ("ADMISSIONS", admissions_each.to_string()),
                    ("STORE_URL", store.url()),
                    ("PROBE_URL", probe.url()),
                ],
            )
        })
        .collect();
    let mut total = 0;
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "child failed: {:?}", out.status);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let admitted: u64 = stdout
            .lines()
            .find_map(|l| l.split("admitted=").nth(1))
            .unwrap_or_else(|| panic!("no count in child output: {stdout}"))
            .parse()
            .unwrap();
        total += admitted;
    }
    let mut p = probe.client();
    let max: u32 = redis::cmd("GET").arg("probe_max").query(&mut p).unwrap();
    let now: i64 = redis::cmd("GET").arg("probe").query(&mut p).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let in_flight = rt.block_on(async {
        let limiter = Limiter::builder(store.store())
            .policy(Policy::new(limit, 0))
            .build();
        limiter.status("hot").await.unwrap().in_flight
    });
    eprintln!("limit {limit}: {processes} processes x 64 tasks, {total} admissions, max in flight seen {max}");
    assert!(total >= admissions_each * processes as u64);
    assert!(max <= limit, "saw {max} in flight at limit {limit}");
    // The load must press on the limit, or the first assertion proves nothing. (The probe samples the
    // holders a little after they are admitted, so at 100 it may see a few fewer.)
    assert!(
        max >= limit - limit / 10,
        "the load never neared the limit: {max} of {limit}"
    );
    assert_eq!(now, 0);
    assert_eq!(in_flight, 0, "everything was released");
}

#[test]
fn no_over_admission_from_4_processes_of_64_tasks_at_limit_4() {
    run_hammer(4, 4, 2_500);
}

#[test]
fn no_over_admission_from_4_processes_of_64_tasks_at_limit_100() {
    run_hammer(100, 4, 23_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_slots_come_back_within_its_lease() {
    let _machine = timing_sensitive().await;
    let redis = TestRedis::start();
    let mut child = spawn_child(
        "hold",
        &[
            ("COUNT", "3".into()),
            ("LEASE_MS", "2000".into()),
            ("STORE_URL", redis.url()),
        ],
    );
    wait_for_line(&mut child, "held");
    let limiter = Limiter::builder(redis.store())
        .policy(Policy::new(3, 0))
        .build();
    // Hold the slots a little longer than one lease: the child's renewals keep them.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(
        limiter.try_acquire("crashy").await.unwrap_err().is_full(),
        "renewed while alive"
    );
    child.kill().unwrap(); // SIGKILL: no release, no goodbye
    child.wait().unwrap();
    let killed = Instant::now();
    let mut permits = Vec::new();
    while permits.len() < 3 {
        assert!(
            killed.elapsed() < Duration::from_secs(3),
            "slots not back 3 s after the kill"
        );
        match limiter.try_acquire("crashy").await {
            Ok(p) => permits.push(p),
            Err(e) if e.is_full() => tokio::time::sleep(Duration::from_millis(25)).await,
            Err(e) => panic!("{e}"),
        }
    }
    eprintln!("all 3 slots back {:?} after SIGKILL", killed.elapsed());
    assert!(limiter.stats().reclaimed.load(Ordering::Relaxed) >= 3);
}
