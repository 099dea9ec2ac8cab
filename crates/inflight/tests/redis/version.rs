//! The oldest Redis inflight supports (6.2): the store reads the server's version once per connection,
//! before its first command, and refuses a Redis older than that with the reason.

use inflight::{AcquireError, Limiter, Policy, RedisStore, Store, StoreError};

use crate::support::TestRedis;

/// The test's redis-server (Debian's, or the one `INFLIGHT_REDIS_SERVER` names) is one the store takes,
/// and it is 6.2 or later.
#[tokio::test]
async fn the_running_server_is_accepted() {
    let redis = TestRedis::start();
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut redis.client())
        .unwrap();
    let version = info
        .lines()
        .find_map(|line| line.strip_prefix("redis_version:"))
        .unwrap()
        .trim()
        .to_owned();
    eprintln!("redis-server {version}");
    let parts: Vec<u32> = version.split('.').map(|p| p.parse().unwrap()).collect();
    assert!(
        parts[..2] >= [6, 2][..],
        "the tests run on 6.2 or later: {version}"
    );
    let store = redis.store();
    store.maintain().await.expect("a supported Redis");
    let limiter = Limiter::builder(store).policy(Policy::new(1, 0)).build();
    let permit = limiter.try_acquire("k").await.unwrap();
    assert!(limiter.try_acquire("k").await.unwrap_err().is_full());
    permit.release().await.unwrap();
}

/// A user whose ACL denies INFO still uses the store: the version is then not checked.
#[tokio::test]
async fn a_user_who_may_not_run_info_is_not_refused() {
    let redis = TestRedis::start();
    let _: () = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER", "limited", "on", ">secret", "~*", "&*", "+@all", "-info",
            ][..],
        )
        .query(&mut redis.client())
        .unwrap();
    let url = format!("redis://limited:secret@127.0.0.1:{}", redis.port());
    let store = test_support::store_builder(url).open().unwrap();
    let limiter = Limiter::builder(store).policy(Policy::new(1, 0)).build();
    let permit = limiter.try_acquire("k").await.unwrap();
    permit.release().await.unwrap();
}

/// A Redis older than 6.2 is refused at the first use, with the reason, before any script reaches it.
#[tokio::test]
async fn a_redis_older_than_6_2_is_refused_with_the_reason() {
    let (port, seen) = test_support::old_redis("6.0.9");
    let store = RedisStore::open(format!("redis://127.0.0.1:{port}")).unwrap();
    let reason = "Redis 6.0.9 is older than 6.2, the oldest inflight supports";
    match store.maintain().await {
        Err(StoreError::Rejected(message)) => assert_eq!(message, reason),
        other => panic!("{other:?}"),
    }
    let limiter = Limiter::builder(store).policy(Policy::new(1, 0)).build();
    match limiter.try_acquire("k").await {
        Err(AcquireError::Store(StoreError::Rejected(message))) => {
            assert!(message.contains(reason), "{message}")
        }
        other => panic!("{:?}", other.map(|_| "a permit")),
    }
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().any(|command| command == "INFO server"),
        "{seen:?}"
    );
    assert!(
        !seen
            .iter()
            .any(|command| command.starts_with("EVAL") || command.starts_with("PING")),
        "nothing but the handshake and the check reaches an old Redis: {seen:?}"
    );
}
