//! What only a real, shared Redis can show: many processes on one key, crashes, outages, restarts.
#![allow(missing_docs)]

mod support;

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use inflight::store::{AcquireRequest, Admission, OverrideChange};
use inflight::{
    AcquireError, AcquireOptions, ClassLimits, FailurePolicy, Limiter, PermitId, Policy,
    RedisStore, Store,
};
use support::TestRedis;

/// Runs this test binary again as a child process doing `role` (see `child_process`).
fn spawn_child(role: &str, env: &[(&str, String)]) -> std::process::Child {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args([
        "--ignored",
        "--exact",
        "child_process",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("INFLIGHT_TEST_CHILD", role)
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child test process")
}

/// Reads the child's output until `line`, then drains the rest in the background (so the child never
/// writes into a closed pipe).
fn wait_for_line(child: &mut std::process::Child, line: &str) {
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    for got in lines.by_ref() {
        if got.expect("child output").contains(line) {
            std::thread::spawn(move || lines.for_each(drop));
            return;
        }
    }
    panic!("the child ended without saying {line:?}");
}

/// The load tests take the machine (4 busy child processes); the tests that time a recovery or a reclaim
/// wait for them rather than share 2 cores with them.
static MACHINE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

fn whole_machine() -> tokio::sync::RwLockWriteGuard<'static, ()> {
    MACHINE.blocking_write()
}

async fn timing_sensitive() -> tokio::sync::RwLockReadGuard<'static, ()> {
    MACHINE.read().await
}

/// Runs `work` on a current-thread runtime of its own, on a thread of its own, as a server worker's; then
/// drops that runtime with whatever tasks it still has.
async fn on_a_runtime_of_its_own<F>(work: impl FnOnce() -> F + Send + 'static)
where
    F: std::future::Future<Output = ()>,
{
    tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(work());
    })
    .await
    .unwrap();
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"))
}

/// The body of the child processes; does nothing unless started by `spawn_child`.
#[test]
#[ignore = "entry point of child processes, started by the tests below"]
fn child_process() {
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
            "hammer" => hammer().await,
            "hold" => hold().await,
            other => panic!("unknown child role {other}"),
        }
    });
}

/// 64 tasks admit on one key until this process has `ADMISSIONS` admissions, recording each admitted
/// request in an independent probe (a counter on another Redis): +1 after admission, -1 before release.
async fn hammer() {
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
async fn hold() {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_held_for_ten_leases_is_never_evicted() {
    let _machine = timing_sensitive().await;
    let redis = TestRedis::start();
    let holder = Limiter::builder(redis.store())
        .policy(Policy::new(1, 0))
        .lease(Duration::from_secs(1))
        .build();
    let other = Limiter::builder(redis.store())
        .policy(Policy::new(1, 0))
        .build();
    let permit = holder.try_acquire("long").await.unwrap();
    let start = Instant::now();
    let mut attempts = 0;
    while start.elapsed() < Duration::from_secs(10) {
        assert!(
            other.try_acquire("long").await.unwrap_err().is_full(),
            "evicted after {:?}",
            start.elapsed()
        );
        attempts += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(attempts > 100);
    assert!(!permit.is_lost());
    assert_eq!(other.stats().reclaimed.load(Ordering::Relaxed), 0);
    drop(permit);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(other.try_acquire("long").await.is_ok());
}

fn limiter_for(redis: &TestRedis, failure: FailurePolicy) -> Limiter<RedisStore> {
    Limiter::builder(redis.store())
        .policy(Policy::new(2, 0))
        .lease(Duration::from_millis(900))
        .on_store_failure(failure)
        .build()
}

/// Waits until an admission works again after Redis came back; returns how long it took.
async fn recovery_time(limiter: &Limiter<RedisStore>, key: &str) -> Duration {
    let back = Instant::now();
    loop {
        if let Ok(permit) = limiter.try_acquire(key).await {
            if permit.is_counted() {
                return back.elapsed();
            }
        }
        assert!(back.elapsed() < Duration::from_secs(5), "no recovery");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_refuses_while_redis_is_down_and_heals_after() {
    let _machine = timing_sensitive().await;
    let mut redis = TestRedis::start();
    let limiter = limiter_for(&redis, FailurePolicy::FailClosed);
    let held = limiter.try_acquire("app").await.unwrap();
    redis.stop();
    for _ in 0..5 {
        match limiter.try_acquire("app").await {
            Err(AcquireError::Store(e)) => assert!(e.is_transient(), "{e}"),
            other => panic!("expected a store error, got {other:?}"),
        }
    }
    drop(held); // its release fails now and is retried in the background
    redis.restart();
    let took = recovery_time(&limiter, "other").await;
    eprintln!("admissions work again {took:?} after Redis came back");
    assert!(took < Duration::from_secs(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_permits_are_re_registered_after_redis_restarts_empty() {
    let _machine = timing_sensitive().await;
    let mut redis = TestRedis::start();
    let limiter = limiter_for(&redis, FailurePolicy::FailClosed);
    let permit = limiter.try_acquire("app").await.unwrap();
    redis.restart(); // empty
    let back = Instant::now();
    loop {
        if limiter
            .status("app")
            .await
            .map(|s| s.in_flight)
            .unwrap_or(0)
            == 1
        {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(2),
            "the renewal did not re-add the lease"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "live permit re-registered {:?} after the restart",
        back.elapsed()
    );
    assert!(!permit.is_lost());
    assert!(limiter.stats().readded.load(Ordering::Relaxed) >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_admits_uncounted_while_redis_is_down() {
    let _machine = timing_sensitive().await;
    let mut redis = TestRedis::start();
    let limiter = limiter_for(&redis, FailurePolicy::FailOpen);
    redis.stop();
    for _ in 0..10 {
        let permit = limiter.try_acquire("app").await.expect("fail open");
        assert!(!permit.is_counted());
    }
    redis.restart();
    let took = recovery_time(&limiter, "app").await;
    assert!(took < Duration::from_secs(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_local_admits_under_a_per_process_cap_while_redis_is_down() {
    let _machine = timing_sensitive().await;
    let mut redis = TestRedis::start();
    let limiter = limiter_for(&redis, FailurePolicy::FailOpenLocal { limit: 3 });
    redis.stop();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(
            limiter
                .try_acquire("app")
                .await
                .expect("under the local cap"),
        );
    }
    assert_eq!(
        limiter.try_acquire("app").await.unwrap_err(),
        AcquireError::Full {
            limit: 3,
            in_flight: 3
        }
    );
    drop(held.pop());
    held.push(
        limiter
            .try_acquire("app")
            .await
            .expect("a local slot came back"),
    );
    // Handed-off permits (what the HTTP API gives out) count against the cap too, until released.
    held.clear();
    let mut leases = Vec::new();
    for _ in 0..3 {
        leases.push(
            limiter
                .try_acquire("handed")
                .await
                .expect("under the cap")
                .detach(),
        );
    }
    assert!(limiter.try_acquire("handed").await.unwrap_err().is_full());
    assert!(limiter
        .release("handed", &leases[0].id)
        .await
        .expect("released from the fallback"));
    let again = limiter
        .try_acquire("handed")
        .await
        .expect("a slot came back");
    drop(again);
    redis.restart();
    let took = recovery_time(&limiter, "app").await;
    assert!(took < Duration::from_secs(1));
}

/// However many batches may be out at once (0 counts as 1), 64 admissions at once on a key of limit 10
/// admit 10, and their releases give the slots back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_pipeline_depth_admits_exactly_the_limit() {
    let redis = TestRedis::start();
    for depth in [0, 1, 3, 8] {
        let store = RedisStore::builder(redis.url())
            .prefix(format!("depth{depth}:"))
            .pipeline(depth)
            .open()
            .unwrap();
        let limiter = Arc::new(Limiter::builder(store).policy(Policy::new(10, 0)).build());
        let attempts: Vec<_> = (0..64)
            .map(|_| {
                let limiter = limiter.clone();
                tokio::spawn(async move { limiter.try_acquire("k").await })
            })
            .collect();
        let mut permits = Vec::new();
        for attempt in attempts {
            match attempt.await.unwrap() {
                Ok(permit) => permits.push(permit),
                Err(error) => assert!(error.is_full(), "depth {depth}: {error}"),
            }
        }
        assert_eq!(permits.len(), 10, "depth {depth}");
        for permit in permits {
            permit.release().await.unwrap();
        }
        assert_eq!(
            limiter.status("k").await.unwrap().in_flight,
            0,
            "depth {depth}"
        );
    }
}

#[tokio::test]
async fn a_limit_set_through_one_connection_applies_to_the_next_admission_on_another() {
    let redis = TestRedis::start();
    let one = Limiter::builder(redis.store())
        .policy(Policy::new(1, 0))
        .build();
    let two = Limiter::builder(redis.store())
        .policy(Policy::new(1, 0))
        .build();
    let _a = two.try_acquire("app").await.unwrap();
    assert!(two.try_acquire("app").await.unwrap_err().is_full());
    one.set_limit("app", 2).await.unwrap();
    let _b = two
        .try_acquire("app")
        .await
        .expect("the new limit, at the very next admission");
    one.set_limit("app", 1).await.unwrap();
    assert!(two.try_acquire("app").await.unwrap_err().is_full());
}

#[tokio::test]
async fn what_is_left_in_redis_expires_except_the_overrides() {
    let redis = TestRedis::start();
    let limiter = Limiter::builder(redis.store())
        .policy(Policy::new(5, 0))
        .build();
    limiter.set_limit("configured", 3).await.unwrap();
    let heavy = limiter
        .try_acquire_with("weighted", AcquireOptions::new().weight(3))
        .await
        .unwrap();
    let plain = limiter.try_acquire("plain").await.unwrap();
    let _detached = limiter.try_acquire("handed-off").await.unwrap().detach();
    heavy.release().await.unwrap();
    plain.release().await.unwrap();
    let mut c = redis.client();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    assert!(!keys.is_empty());
    for key in keys {
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut c).unwrap();
        if key.ends_with(":limit") || key.starts_with("inflight:overrides") {
            assert!(
                [
                    "inflight:{configured}:limit",
                    "inflight:overrides",
                    "inflight:overrides:version"
                ]
                .contains(&key.as_str()),
                "{key}"
            );
            assert_eq!(
                ttl, -1,
                "an override (and its index) is configuration: it stays"
            );
        } else {
            assert!(ttl > 0, "{key} would never expire");
        }
    }
}

#[tokio::test]
async fn scripts_are_reloaded_after_a_script_flush() {
    let redis = TestRedis::start();
    let limiter = Limiter::builder(redis.store())
        .policy(Policy::new(1, 0))
        .build();
    limiter
        .try_acquire("a")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .exec(&mut redis.client())
        .unwrap();
    let permit = limiter
        .try_acquire("a")
        .await
        .expect("NOSCRIPT answered by loading the script");
    permit.release().await.unwrap();
}

#[tokio::test]
async fn a_bad_url_is_refused_at_once_with_the_reason() {
    let err = RedisStore::open("postgres://localhost").unwrap_err();
    assert!(err.to_string().contains("invalid Redis URL"), "{err}");
    assert!(!err.is_transient());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_given_up_while_redis_decides_leaves_no_lease() {
    let redis = TestRedis::start();
    let limiter = Limiter::builder(redis.store())
        .policy(Policy::new(1, 0))
        .build();
    // Connected, and the scripts loaded.
    limiter
        .try_acquire("k")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    // Redis holds every command for a while: the admission is sent, then its caller gives up.
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(300)
        .arg("ALL")
        .exec(&mut redis.client())
        .unwrap();
    let gave_up = tokio::time::timeout(Duration::from_millis(50), limiter.try_acquire("k")).await;
    assert!(
        gave_up.is_err(),
        "the admission was still waiting for Redis"
    );
    // Once Redis goes on, it admits, and the release queued behind the admission takes the lease back.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let status = limiter.status("k").await.unwrap();
    assert_eq!(status.in_flight, 0, "the abandoned admission holds a slot");
    let permit = limiter.try_acquire("k").await.expect("the slot is free");
    permit.release().await.unwrap();
}

#[test]
fn opening_a_store_outside_a_runtime_is_an_error_not_a_panic() {
    let err = RedisStore::open("redis://127.0.0.1:1").unwrap_err();
    assert!(err.to_string().contains("Tokio runtime"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_first_used_from_a_runtime_that_ends_keeps_working() {
    let redis = TestRedis::start();
    let store = redis.store();
    let policy = Policy::new(1, 0);
    // Another runtime makes the first use, so it owns the lazily made connection; then that runtime ends,
    // and the connection with it: the store's next command finds it gone and goes on a new one.
    let elsewhere = store.clone();
    on_a_runtime_of_its_own(move || async move {
        elsewhere.maintain().await.unwrap();
        let limiter = Limiter::builder(elsewhere)
            .policy(Policy::new(1, 0))
            .build();
        limiter
            .try_acquire("k")
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        limiter.status("k").await.unwrap();
    })
    .await;
    store
        .maintain()
        .await
        .expect("the connection outlives the other runtime");
    let limits = policy.default_limits();
    let keep = OverrideChange::Keep;
    assert_eq!(store.status("k", limits, keep).await.unwrap().in_flight, 0);
    let limiter = Limiter::builder(store).policy(policy).build();
    let permit = limiter.try_acquire("k").await.unwrap();
    assert_eq!(limiter.status("k").await.unwrap().in_flight, 1);
    permit.release().await.unwrap();
}

#[tokio::test]
async fn the_store_connects_lazily_and_a_dead_server_is_a_transient_error() {
    let mut redis = TestRedis::start();
    let store = redis.store();
    redis.stop();
    let started = Instant::now();
    let err = store.maintain().await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));
    let status = store
        .status("k", ClassLimits::new(1, 0), OverrideChange::Keep)
        .await;
    assert!(status.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_release_cut_short_goes_on_in_the_background() {
    let _machine = timing_sensitive().await;
    let mut redis = TestRedis::start();
    let limiter = Limiter::builder(redis.store())
        .policy(Policy::new(1, 0))
        .build();
    let permit = limiter.try_acquire("app").await.unwrap();
    redis.stop();
    // The caller gives up on the release (a timeout around it), while Redis is away.
    let _ = tokio::time::timeout(Duration::from_millis(50), permit.release()).await;
    redis.restart();
    let started = Instant::now();
    while limiter
        .status("app")
        .await
        .map(|s| s.in_flight)
        .unwrap_or(1)
        != 0
    {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the release was not carried on"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One batch that empties a key and fills it again: the set Redis deletes with its last lease and the one
/// the next admission creates are two keys, and the new one must get an expiry of its own.
#[tokio::test]
async fn a_key_emptied_and_refilled_within_one_batch_still_expires() {
    let redis = TestRedis::start();
    let store = redis.store();
    let limits = [ClassLimits::new(4, 0)];
    let (first, second) = (PermitId::generate(), PermitId::generate());
    let keys = [std::sync::Arc::from("k")];
    let acquire = |id| {
        store.acquire(AcquireRequest {
            keys: &["k"],
            id,
            weight: 1,
            lease_ms: 30_000,
            limits: &limits,
        })
    };
    // Sent together from one thread, so they reach the dispatcher, and Redis, as one batch in this order.
    let (a, released, b) = tokio::join!(
        acquire(&first),
        store.release(&keys, &first),
        acquire(&second)
    );
    assert!(matches!(a.unwrap(), Admission::Admitted { .. }));
    assert!(released.unwrap());
    assert!(matches!(b.unwrap(), Admission::Admitted { .. }));
    let mut c = redis.client();
    let ttl: i64 = redis::cmd("PTTL")
        .arg("inflight:{k}:leases")
        .query(&mut c)
        .unwrap();
    assert!(
        ttl > 30_000,
        "the refilled set must expire after its lease, PTTL {ttl}"
    );
}

#[tokio::test]
async fn weights_never_outlive_the_leases_they_count() {
    let redis = TestRedis::start();
    let limiter = Limiter::builder(redis.store())
        .policy(Policy::new(10, 0))
        .build();
    let _plain = limiter.try_acquire("k").await.unwrap();
    let _heavy = limiter
        .try_acquire_with(
            "k",
            AcquireOptions::new()
                .weight(5)
                .lease(Duration::from_secs(60)),
        )
        .await
        .unwrap();
    let mut c = redis.client();
    let leases: i64 = redis::cmd("PTTL")
        .arg("inflight:{k}:leases")
        .query(&mut c)
        .unwrap();
    let weights: i64 = redis::cmd("PTTL")
        .arg("inflight:{k}:permits")
        .query(&mut c)
        .unwrap();
    assert!(
        weights > 0 && weights <= leases,
        "weights {weights} ms, leases {leases} ms"
    );
    // If the leases vanish alone (evicted), their weights must not keep counting.
    redis::cmd("DEL")
        .arg("inflight:{k}:leases")
        .exec(&mut c)
        .unwrap();
    assert_eq!(limiter.status("k").await.unwrap().in_flight, 0);
    let heavy = limiter
        .try_acquire_with("k", AcquireOptions::new().weight(10))
        .await;
    assert!(heavy.is_ok(), "{heavy:?}");
}

#[tokio::test]
async fn a_unix_socket_url_works() {
    let dir = std::env::temp_dir().join(format!("inflight-unix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("redis.sock");
    let mut server = Command::new("redis-server")
        .args(["--port", "0", "--save", "", "--unixsocket"])
        .arg(&socket)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !socket.exists() {
        assert!(started.elapsed() < Duration::from_secs(5), "no socket");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let store = RedisStore::open(format!("unix://{}", socket.display())).unwrap();
    let limiter = Limiter::builder(store).policy(Policy::new(1, 0)).build();
    let result = async {
        let permit = limiter.try_acquire("k").await?;
        let full = limiter.try_acquire("k").await.unwrap_err().is_full();
        permit.release().await?;
        Ok::<_, AcquireError>(full)
    }
    .await;
    server.kill().unwrap();
    server.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        result.expect("admissions over the socket"),
        "the limit held over the socket"
    );
}

#[cfg(feature = "tls")]
#[tokio::test]
async fn a_rediss_url_works_with_a_private_ca() {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, KeyUsagePurpose};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let server_key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&server_key, &ca, &ca_key)
        .unwrap();
    let dir = std::env::temp_dir().join(format!("inflight-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca_path, cert_path, key_path) = (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    );
    std::fs::write(&ca_path, ca.pem()).unwrap();
    std::fs::write(&cert_path, server.pem()).unwrap();
    std::fs::write(&key_path, server_key.serialize_pem()).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut redis = Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--tls-auth-clients",
            "no",
        ])
        .arg("--tls-port")
        .arg(port.to_string())
        .arg("--tls-cert-file")
        .arg(&cert_path)
        .arg("--tls-key-file")
        .arg(&key_path)
        .arg("--tls-ca-cert-file")
        .arg(&ca_path)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let store = RedisStore::builder(format!("rediss://127.0.0.1:{port}"))
        .root_cert(ca.pem())
        .open()
        .unwrap();
    let started = Instant::now();
    let mut ready = store.maintain().await;
    while ready.is_err() && started.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        ready = store.maintain().await;
    }
    let outcome = async {
        ready?;
        let limiter = Limiter::builder(store).policy(Policy::new(1, 0)).build();
        let permit = limiter
            .try_acquire("k")
            .await
            .map_err(|e| inflight::StoreError::Protocol(e.to_string()))?;
        let full = limiter.try_acquire("k").await.is_err();
        permit.release().await?;
        Ok::<_, inflight::StoreError>(full)
    }
    .await;
    redis.kill().unwrap();
    redis.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        outcome.expect("admissions over TLS"),
        "the limit held over TLS"
    );
}

/// After Redis restarts, the connection the store had is dead; the first admission finds out by writing
/// to it. It must not answer 503 for that: it tries once more on the connection made anew.
#[tokio::test]
async fn the_first_admission_after_redis_restarts_does_not_fail_on_the_dead_connection() {
    let mut redis = TestRedis::start();
    let limiter = Limiter::builder(redis.store())
        .policy(Policy::new(2, 0))
        .on_store_failure(FailurePolicy::FailClosed)
        .build();
    limiter
        .try_acquire("k")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    redis.restart();
    let admitted = limiter.try_acquire("k").await;
    assert!(admitted.is_ok(), "{admitted:?}");
    assert_eq!(limiter.status("k").await.unwrap().in_flight, 1);
}

/// An admission that timed out may still be made by Redis once it goes on: its lease must not be left
/// holding a slot that nobody holds.
#[tokio::test]
async fn an_admission_that_timed_out_leaves_no_lease_when_redis_makes_it_late() {
    let redis = TestRedis::start();
    let store = redis
        .store_builder()
        .response_timeout(Duration::from_millis(100))
        .open()
        .unwrap();
    let limiter = Limiter::builder(store)
        .policy(Policy::new(1, 0))
        .lease(Duration::from_secs(60))
        .build();
    // Connected, and the scripts loaded.
    limiter
        .try_acquire("k")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // Redis stops for 400 ms (SIGSTOP), as a server stalled by a slow disk or a long command would.
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut redis.client())
        .unwrap();
    let pid = info
        .lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .unwrap()
        .trim()
        .to_owned();
    let signal = |name: &str| {
        let status = std::process::Command::new("kill")
            .arg(name)
            .arg(&pid)
            .status();
        assert!(status.unwrap().success());
    };
    signal("-STOP");
    let resume = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(400));
        std::process::Command::new("kill")
            .arg("-CONT")
            .arg(&pid)
            .status()
            .unwrap();
    });
    let timed_out = limiter.try_acquire("k").await.unwrap_err();
    resume.join().unwrap();
    assert!(
        matches!(timed_out, inflight::AcquireError::Store(_)),
        "{timed_out:?}"
    );
    // Redis goes on, makes the admission, and then takes the release retried behind it.
    let started = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Ok(status) = limiter.status("k").await {
            if status.in_flight == 0 && started.elapsed() > Duration::from_millis(600) {
                break;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the late admission holds a slot"
        );
    }
}

/// A server's workers each have a limiter and a store of their own; the fail_open_local cap is still one
/// per process, because they share its fallback store.
#[tokio::test]
async fn limiters_that_share_a_fallback_share_the_fail_open_local_cap() {
    let mut redis = TestRedis::start();
    let fallback = inflight::MemoryStore::new();
    let worker = || {
        Limiter::builder(redis.store())
            .policy(Policy::new(5, 0))
            .on_store_failure(FailurePolicy::FailOpenLocal { limit: 2 })
            .fallback(fallback.clone())
            .build()
    };
    let (one, two) = (worker(), worker());
    redis.stop();
    let _a = one.try_acquire("app").await.expect("under the cap");
    let _b = two.try_acquire("app").await.expect("under the cap");
    assert!(one.try_acquire("app").await.unwrap_err().is_full());
    assert!(two.try_acquire("app").await.unwrap_err().is_full());
}

/// The release task bounds the releases pending at once (65,536), not all it ever had: far more dropped
/// permits than that are all released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_dropped_permits_than_the_pending_bound_are_all_released() {
    let redis = TestRedis::start();
    let limiter = Limiter::builder(redis.store())
        .policy(Policy::new(64, 0))
        .lease(Duration::from_secs(60))
        .build();
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let mut admitted = 0;
                while admitted < 1_100 {
                    match limiter.try_acquire("k").await {
                        Ok(permit) => {
                            admitted += 1;
                            drop(permit);
                        }
                        Err(error) => {
                            assert!(error.is_full(), "{error}");
                            tokio::task::yield_now().await;
                        }
                    }
                }
            })
        })
        .collect();
    let all = futures_util::future::join_all(tasks);
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("70,400 permits admitted: their slots came back");
    let started = Instant::now();
    while limiter.status("k").await.unwrap().in_flight > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "releases were dropped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
