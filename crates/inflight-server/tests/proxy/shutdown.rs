//! Shutdown: running streams finish within the grace period, what outlives it is released, idle
//! connections close at once, a second SIGTERM exits, and nothing is left in Redis.

use std::time::Duration;

use inflight::store::OverrideChange;
use reqwest::{Client, StatusCode};

use crate::common;
use crate::common::process::{listen_of, Running};
use crate::common::{limits, proxy_settings, start_proxy, Make, TestRedis, Upstream};
use crate::per_store;
use crate::{keyed, proxied, KEY};

async fn shutdown_lets_running_streams_finish<M: Make>() {
    let mut args = limits(2, 0);
    args.shutdown_grace = Duration::from_secs(5);
    let (_redis, upstream, mut server) = proxied::<M>(args).await;
    let http = Client::new();
    let mut stream = keyed(&http, server.url("/sse"), "k").await;
    assert_eq!(stream.chunk().await.unwrap().unwrap(), "data: 0\n\n");
    server.signal();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        Client::new()
            .get(server.url("/echo/x"))
            .header(KEY, "k")
            .send()
            .await
            .is_err(),
        "no new connections after the signal"
    );
    upstream.gate.add_permits(2);
    let mut rest = Vec::new();
    while let Some(chunk) = stream.chunk().await.unwrap() {
        rest.extend_from_slice(&chunk);
    }
    assert_eq!(
        rest, b"data: 1\n\ndata: 2\n\n",
        "the running stream finished"
    );
    server.finished().await.unwrap();
    assert_eq!(server.in_flight("k").await, 0);
}

async fn shutdown_releases_what_outlives_the_grace_period<M: Make>() {
    let mut args = limits(2, 0);
    args.shutdown_grace = Duration::from_millis(300);
    let (_redis, _upstream, mut server) = proxied::<M>(args).await;
    let http = Client::new();
    let mut stream = keyed(&http, server.url("/forever"), "k").await;
    assert!(stream.chunk().await.unwrap().is_some());
    server.signal();
    let finished = server.finished().await;
    assert!(finished.is_err(), "a cut response makes the end an error");
    // Released by the time the server has finished, not some time after.
    assert_eq!(
        server.in_flight("k").await,
        0,
        "the cut stream's permit was released"
    );
}

/// On shutdown, a client's idle kept-alive connection is closed at once: the server ends long before the
/// grace period would have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_idle_connections_at_once() {
    let upstream = Upstream::start().await;
    let mut args = limits(2, 0);
    args.shutdown_grace = Duration::from_secs(60);
    let settings = proxy_settings(&upstream.base, args);
    let mut server = start_proxy(&settings, common::Memory::stores(&None)).await;
    let http = Client::new();
    for _ in 0..3 {
        let response = keyed(&http, server.url("/echo/x"), "k").await;
        assert_eq!(response.status(), StatusCode::OK);
        response.bytes().await.unwrap(); // the connection goes back to the client's pool, open
    }
    server.signal();
    let finished = tokio::time::timeout(Duration::from_secs(10), server.finished()).await;
    assert!(
        matches!(finished, Ok(Ok(()))),
        "the idle connection kept the server open: {finished:?}"
    );
    drop(http);
}

/// The `inflight` binary as an operator runs it, on Redis: SIGTERM while streams are running and the
/// grace period too short for them; once it has exited, none of its leases is left in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_exit_leaves_no_lease_in_redis() {
    use inflight::Store;
    let redis = TestRedis::start();
    let upstream = Upstream::start().await;
    let (mut server, started) = Running::start(&[
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--upstream",
        &upstream.base,
        "--store",
        &redis.url(),
        "--default-limit",
        "10",
        "--shutdown-grace",
        "300ms",
    ]);
    let listen = listen_of(&started);
    let mut streams = Vec::new();
    for _ in 0..4 {
        let mut stream = keyed(&Client::new(), format!("http://{listen}/forever"), "k").await;
        assert!(stream.chunk().await.unwrap().is_some());
        streams.push(stream);
    }
    let store = redis.store();
    let (policy, keep) = (inflight::ClassLimits::new(10, 0), OverrideChange::Keep);
    assert_eq!(store.status("k", policy, keep).await.unwrap().in_flight, 4);
    server.signal("-TERM");
    // Redis answers slowly from now on, so the releases of the cut streams are still running when the
    // workers have ended: the exit has to wait for them.
    ::redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(800)
        .arg("ALL")
        .exec(&mut redis.client())
        .unwrap();
    let paused_until = tokio::time::Instant::now() + Duration::from_millis(900);
    let (mut server, exit) = tokio::task::spawn_blocking(move || {
        let exit = server.wait_for(Duration::from_secs(10));
        (server, exit)
    })
    .await
    .unwrap();
    // Streams were cut: the exit says so, with its code, once every release is done.
    assert_eq!(exit.code(), Some(1), "{exit:?}: {:?}", server.rest_of_log());
    tokio::time::sleep_until(paused_until).await; // what Redis held back has been done by now
    assert_eq!(
        store.status("k", policy, keep).await.unwrap().in_flight,
        0,
        "leases left in Redis after a clean exit"
    );
    drop(streams);
}

/// A second SIGTERM while the server waits for its streams ends it at once (exit code 130), instead of
/// after the grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_exits_at_once() {
    let upstream = Upstream::start().await;
    let (mut server, started) = Running::start(&common::process::proxy_args(
        &upstream.base,
        &["--default-limit", "10", "--shutdown-grace", "60s"],
    ));
    let listen = listen_of(&started);
    let mut stream = keyed(&Client::new(), format!("http://{listen}/forever"), "k").await;
    assert!(stream.chunk().await.unwrap().is_some());
    server.signal("-TERM");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(server.is_running(), "still waiting for the stream");
    server.signal("-TERM");
    let exit = tokio::task::spawn_blocking(move || server.wait_for(Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(130), "{exit:?}");
    drop(stream);
}

per_store!(
    shutdown_lets_running_streams_finish,
    shutdown_releases_what_outlives_the_grace_period,
);
