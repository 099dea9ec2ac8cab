//! The ways of reaching Redis: URLs (TCP, Unix socket, TLS), runtimes that end, scripts flushed.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use inflight::store::OverrideChange;
use inflight::{AcquireError, AcquireOptions, Limiter, Policy, RedisStore, RemoteLease, Store};

use crate::support::TestRedis;

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

#[tokio::test]
async fn a_bad_url_is_refused_at_once_with_the_reason() {
    let err = RedisStore::open("postgres://localhost").unwrap_err();
    assert!(err.to_string().contains("invalid Redis URL"), "{err}");
    assert!(!err.is_transient());
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
async fn a_unix_socket_url_works() {
    let dir = std::env::temp_dir().join(format!("inflight-unix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("redis.sock");
    let mut server = Command::new(test_support::procs::server_bin())
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
    let mut redis = Command::new(test_support::procs::server_bin())
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

/// The second finding: after Redis loses its scripts, each batch out gets NOSCRIPT, loads the
/// script and is sent again, so a batch sent later may run first: a new admission of an id before the
/// release of its previous one, which then removed the new lease (held, counted nowhere). Whatever
/// order they run in, the later admission's lease is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_sent_again_after_a_script_flush_never_uncount_a_later_admission() {
    let redis = TestRedis::start();
    let limiter = Limiter::builder(redis.store())
        .policy(Policy::new(1, 0))
        .build();
    let mut plain = redis.client();
    for round in 0..100 {
        let options = || AcquireOptions::new().id(format!("job-{round}"));
        let first = limiter.try_acquire_with("k", options()).await.unwrap();
        let first = first.detach();
        redis::cmd("SCRIPT").arg("FLUSH").exec(&mut plain).unwrap();
        let first = RemoteLease::new(&["k"], first.id, first.token);
        let release = limiter.release(&first);
        let (_, second) = tokio::join!(release, limiter.try_acquire_with("k", options()));
        let second = second.expect("the id's own slot").detach();
        let status = limiter.status("k").await.unwrap();
        assert_eq!(
            status.in_flight, 1,
            "round {round}: the later admission is counted"
        );
        assert!(limiter.try_acquire("k").await.unwrap_err().is_full());
        let second = RemoteLease::new(&["k"], second.id, second.token);
        assert!(limiter.release(&second).await.unwrap().0);
    }
}
