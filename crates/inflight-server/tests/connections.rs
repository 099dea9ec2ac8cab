//! The bounds of a server's connections against clients that hold them open, on raw sockets on loopback:
//! idle, slow-body and HTTP/2 connections, the connection cap. Each test is a row of RELIABILITY.md.
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::process::{admin_of, listen_of, Running};
use common::raw::{answer, closed_within, connect, json, send};
use common::{limits, start_api, start_proxy, Make, Memory};
use inflight_server::Settings;

/// Settings with these timeouts (and the others' defaults).
fn timeouts(header: u64, idle: u64, body: u64) -> Settings {
    let mut settings = limits(5, 0);
    settings.connections.header_timeout = Duration::from_millis(header);
    settings.connections.idle_timeout = Duration::from_millis(idle);
    settings.connections.body_timeout = Duration::from_millis(body);
    settings
}

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";

/// A kept-alive connection that sends no next request is closed after `--idle-timeout`, though the
/// header timeout is far longer (hyper's header timer, which also ran between requests, is not used).
#[tokio::test]
async fn an_idle_kept_alive_connection_is_closed_after_the_idle_timeout() {
    let server = start_api(&timeouts(20_000, 300, 20_000), Memory::stores(&None)).await;
    let mut idle = connect(&server.base).await;
    send(&mut idle, HEALTHZ).await;
    assert!(answer(&mut idle).await.0.starts_with("HTTP/1.1 200"));
    assert!(
        closed_within(&mut idle, Duration::from_secs(3)).await,
        "an idle connection was left open"
    );
}

/// The idle timeout runs between exchanges only: an answer that takes longer (a slow upstream) is not
/// cut, and the connection serves the next request after it.
#[tokio::test]
async fn an_answer_slower_than_the_idle_timeout_is_not_cut() {
    let upstream = common::Upstream::start().await;
    let settings = common::proxy_settings(&upstream.base, timeouts(200, 200, 200));
    let server = start_proxy(&settings, Memory::stores(&None)).await;
    let mut client = connect(&server.base).await;
    let slow = b"GET /delay/700 HTTP/1.1\r\nHost: x\r\nX-Inflight-Key: k\r\n\r\n";
    send(&mut client, slow).await;
    let (head, body) = answer(&mut client).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body, "late, but answered");
    send(
        &mut client,
        b"GET /_inflight/healthz HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .await;
    assert!(answer(&mut client).await.0.starts_with("HTTP/1.1 200"));
}

/// An HTTP/2 connection with no stream open is closed after `--idle-timeout`.
#[tokio::test]
async fn an_idle_http2_connection_is_closed_after_the_idle_timeout() {
    let server = start_api(&timeouts(20_000, 300, 20_000), Memory::stores(&None)).await;
    let tcp = connect(&server.base).await;
    let (mut client, mut connection) = h2::client::handshake(tcp).await.unwrap();
    let request = http::Request::get(server.url("/healthz")).body(()).unwrap();
    let (response, _) = client.send_request(request, true).unwrap();
    let response = tokio::select! {
        response = response => response.unwrap(),
        _ = &mut connection => panic!("the connection ended before the answer"),
    };
    assert_eq!(response.status(), 200);
    let closed = tokio::time::timeout(Duration::from_secs(3), connection).await;
    assert!(closed.is_ok(), "an idle HTTP/2 connection was left open");
}

/// A request whose body stops arriving is answered `408 body_timeout` after `--body-timeout`, and its
/// connection closed: by the API, and by the proxy, which releases the request's permit.
#[tokio::test]
async fn a_body_that_stops_arriving_is_answered_408() {
    let settings = timeouts(20_000, 20_000, 300);
    let api = start_api(&settings, Memory::stores(&None)).await;
    let upstream = common::Upstream::start().await;
    let proxy = start_proxy(
        &common::proxy_settings(&upstream.base, settings),
        Memory::stores(&None),
    )
    .await;
    for (base, request) in [
        (&api.base, "POST /v1/keys/k/permits HTTP/1.1\r\n"),
        (
            &proxy.base,
            "POST /echo/x HTTP/1.1\r\nX-Inflight-Key: k\r\n",
        ),
    ] {
        let mut slow = connect(base).await;
        let head = format!("{request}Host: x\r\nContent-Length: 50\r\n\r\n{{\"lease");
        send(&mut slow, head.as_bytes()).await;
        let (head, body) = answer(&mut slow).await;
        assert!(head.starts_with("HTTP/1.1 408"), "{head}");
        let body = json(&body);
        assert_eq!(
            (body["code"].as_str(), body["status"].as_u64()),
            (Some("body_timeout"), Some(408)),
            "{body}"
        );
        assert!(closed_within(&mut slow, Duration::from_secs(3)).await);
    }
    common::wait_in_flight(&proxy.url("/_inflight"), "k", 0).await;
}

/// At `--max-connections`, `serve` answers up to 16 more connections, with health, readiness and metrics
/// only (`503 too_many_connections` otherwise), one answer each; a place given back is taken by the
/// next connection.
#[tokio::test]
async fn at_the_connection_cap_serve_answers_health_checks_from_its_reserve() {
    let mut settings = limits(5, 0);
    settings.connections.max_connections = 2;
    settings.workers = Some(1);
    let server = start_api(&settings, Memory::stores(&None)).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut client = connect(&server.base).await;
        send(&mut client, HEALTHZ).await;
        assert!(answer(&mut client).await.0.starts_with("HTTP/1.1 200"));
        held.push(client);
    }
    let mut past = connect(&server.base).await;
    send(&mut past, b"GET /v1/keys/k HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let (head, body) = answer(&mut past).await;
    assert!(head.starts_with("HTTP/1.1 503"), "{head}");
    assert_eq!(json(&body)["code"], "too_many_connections");
    assert!(
        closed_within(&mut past, Duration::from_secs(3)).await,
        "one answer only"
    );
    let mut health = connect(&server.base).await;
    send(&mut health, HEALTHZ).await;
    assert!(answer(&mut health).await.0.starts_with("HTTP/1.1 200"));
    drop(held.pop());
    // The server sees the close when it reads it: until then a new connection is in the reserve.
    let started = std::time::Instant::now();
    loop {
        let mut next = connect(&server.base).await;
        send(&mut next, b"GET /v1/keys/k HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let (head, _) = answer(&mut next).await;
        if head.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(head.starts_with("HTTP/1.1 503"), "{head}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the place never came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// At `--max-connections` (counted over both workers' listeners) the proxy stops accepting: a new
/// connection waits until one closes, and `/healthz` on the admin listener answers meanwhile.
#[tokio::test]
async fn at_the_connection_cap_the_proxy_waits_and_its_admin_listener_answers() {
    let upstream = common::Upstream::start().await;
    let (_server, started) = Running::start(&common::process::proxy_args(
        &upstream.base,
        &[
            "--workers",
            "2",
            "--max-connections",
            "2",
            "--on-missing-key",
            "pass",
        ],
    ));
    assert!(started.contains("max_connections=2"), "{started}");
    let (base, admin) = (listen_of(&started), admin_of(&started));
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut client = connect(&base).await;
        send(&mut client, b"GET /echo/a HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(answer(&mut client).await.0.starts_with("HTTP/1.1 200"));
        held.push(client);
    }
    let mut waiting = connect(&base).await;
    send(&mut waiting, b"GET /echo/b HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let early = tokio::time::timeout(Duration::from_millis(300), answer(&mut waiting)).await;
    assert!(early.is_err(), "answered past the cap: {early:?}");
    let mut health = connect(&admin).await;
    send(&mut health, HEALTHZ).await;
    assert!(answer(&mut health).await.0.starts_with("HTTP/1.1 200"));
    drop(held.pop());
    let (head, _) = answer(&mut waiting).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}

/// Under a limit of 256 open files, 300 idle connections do not starve the process: the cap is lowered
/// at start to leave room, and `/healthz` on the admin listener answers.
#[tokio::test]
async fn under_a_low_open_files_limit_the_admin_listener_still_answers() {
    let upstream = common::Upstream::start().await;
    let (_server, started) = Running::start_command(
        std::process::Command::new("sh")
            .args(["-c", "ulimit -n 256 && exec \"$0\" \"$@\""])
            .arg(env!("CARGO_BIN_EXE_inflight"))
            .args([
                "proxy",
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
            ])
            .args(["--upstream", &upstream.base, "--workers", "1"])
            .env_clear(),
    );
    // 256 files, less the admin listener's 64 connections, a worker's 2 and 64 spare, at 2 files each.
    assert!(started.contains("max_connections=63"), "{started}");
    let (base, admin) = (listen_of(&started), admin_of(&started));
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(connect(&base).await);
    }
    let mut health = connect(&admin).await;
    send(&mut health, HEALTHZ).await;
    assert!(answer(&mut health).await.0.starts_with("HTTP/1.1 200"));
}

/// HTTP/2's limits are the settings': the streams a connection may open, the window a stream starts
/// with, the largest header list (past it, 431 or a reset stream).
#[tokio::test]
async fn http2_limits_are_what_the_settings_say() {
    let mut settings = limits(5, 0);
    settings.connections.http2_max_concurrent_streams = 3;
    settings.connections.http2_stream_window = 4096;
    settings.connections.http2_max_header_list_size = 2048;
    let server = start_api(&settings, Memory::stores(&None)).await;
    let (mut client, mut connection) = h2::client::handshake(connect(&server.base).await)
        .await
        .unwrap();
    let healthz = || http::Request::get(server.url("/healthz"));
    let (response, _) = client
        .send_request(healthz().body(()).unwrap(), true)
        .unwrap();
    let response = tokio::select! {
        response = response => response.unwrap(),
        _ = &mut connection => panic!("the connection ended"),
    };
    assert_eq!(response.status(), 200);
    assert_eq!(connection.max_concurrent_send_streams(), 3);
    let post = http::Request::post(server.url("/v1/keys/k/permits"));
    let (_, mut body) = client.send_request(post.body(()).unwrap(), false).unwrap();
    body.reserve_capacity(1 << 20);
    let capacity = tokio::select! {
        capacity = std::future::poll_fn(|cx| body.poll_capacity(cx)) => capacity.unwrap().unwrap(),
        _ = &mut connection => panic!("the connection ended"),
    };
    assert_eq!(capacity, 4096, "the stream's window");
    let big = healthz()
        .header("x-padding", "a".repeat(4000))
        .body(())
        .unwrap();
    let refused = match client.send_request(big, true) {
        Err(_) => true,
        Ok((response, _)) => tokio::select! {
            response = response => response.map_or(true, |r| r.status() == 431),
            _ = &mut connection => true,
        },
    };
    assert!(refused, "a header list over the limit was served");
}
