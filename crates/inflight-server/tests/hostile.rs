//! Clients that hold the server's places without using them, on raw sockets on loopback: bodies
//! trickled in, idle sockets past the connection cap, answers and status streams never read, transfer
//! codings the server does not implement. Each test is a row of RELIABILITY.md.
#![allow(missing_docs)]

mod common;

use std::time::{Duration, Instant};

use common::process::{listen_of, Running};
use common::raw::{answer, closed_within, connect, json, send};
use common::{limits, start_api, start_proxy, Make, Memory};
use inflight_server::Settings;
use tokio::net::TcpStream;

/// Settings whose request bodies may keep the server waiting `timeout` in all, at `min_rate` bytes a
/// second at least after the first 5 s.
fn bodies(timeout: Duration, min_rate: u64) -> Settings {
    let mut settings = limits(5, 0);
    settings.connections.body_timeout = timeout;
    settings.connections.body_min_rate = min_rate;
    settings
}

/// Sends `head`, then the body one byte every `every` until an answer arrives (30 s at most); that
/// answer.
async fn trickle(stream: &mut TcpStream, head: &str, every: Duration) -> (String, String) {
    send(stream, head.as_bytes()).await;
    let mut peeked = [0u8; 1];
    let started = Instant::now();
    loop {
        assert!(started.elapsed() < Duration::from_secs(30), "never cut");
        match tokio::time::timeout(every, stream.peek(&mut peeked)).await {
            Ok(_) => return answer(stream).await,
            Err(_) => send(stream, b"x").await,
        }
    }
}

/// An API server and a proxy (to a test upstream) with these settings, and the start of a POST to each,
/// the proxy's under key `k`.
struct Both {
    api: common::Server<inflight::MemoryStore>,
    proxy: common::Server<inflight::MemoryStore>,
    upstream: common::Upstream,
}

impl Both {
    async fn start(settings: Settings) -> Self {
        let api = start_api(&settings, Memory::stores(&None)).await;
        let upstream = common::Upstream::start().await;
        let proxied = common::proxy_settings(&upstream.base, settings);
        let proxy = start_proxy(&proxied, Memory::stores(&None)).await;
        Self {
            api,
            proxy,
            upstream,
        }
    }

    /// Each server's base URL and the first lines of a POST to it.
    fn posts(&self) -> [(&str, &str); 4] {
        [
            (&self.api.base, "POST /v1/keys/k/permits HTTP/1.1\r\n"),
            // (The quota routes whose body is required: 400 for an unreadable body before.)
            (&self.api.base, "PUT /v1/quotas/q HTTP/1.1\r\n"),
            (&self.api.base, "POST /v1/quotas/q/top-up HTTP/1.1\r\n"),
            (
                &self.proxy.base,
                "POST /echo/x HTTP/1.1\r\nX-Inflight-Key: k\r\n",
            ),
        ]
    }
}

/// A body trickled in one byte at a time, each byte well within any wait between reads, is cut at
/// `--body-timeout` in all (before, the timeout counted each wait alone and such a body was never cut):
/// `408 body_timeout`, by the API and through the proxy, which releases the request's permit.
#[tokio::test]
async fn a_trickled_body_is_cut_at_the_body_timeout_in_all() {
    let both = Both::start(bodies(Duration::from_millis(800), 0)).await;
    for (base, request) in both.posts() {
        let mut slow = connect(base).await;
        // 200 bytes at one every 50 ms would take 10 s.
        let head = format!("{request}Host: x\r\nContent-Length: 200\r\n\r\n");
        let started = Instant::now();
        let (head, body) = trickle(&mut slow, &head, Duration::from_millis(50)).await;
        assert!(head.starts_with("HTTP/1.1 408"), "{head}");
        assert!(started.elapsed() < Duration::from_secs(5), "cut late");
        let body = json(&body);
        assert_eq!(body["code"], "body_timeout", "{body}");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("did not arrive within"),
            "{body}"
        );
        assert!(closed_within(&mut slow, Duration::from_secs(3)).await);
    }
    common::wait_in_flight(&both.proxy.url("/_inflight"), "k", 0).await;
    assert_eq!(
        both.upstream.hits(),
        1,
        "the proxy forwarded the one request"
    );
}

/// A body slower than `--body-min-rate` (here 10 bytes a second against a minimum of 100) is cut once
/// the first 5 s are over, though the total timeout is far off.
#[tokio::test]
async fn a_body_slower_than_the_minimum_rate_is_cut_after_the_first_seconds() {
    let settings = bodies(Duration::from_secs(60), 100);
    let api = start_api(&settings, Memory::stores(&None)).await;
    let mut slow = connect(&api.base).await;
    let head = "POST /v1/keys/k/permits HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n";
    let started = Instant::now();
    let (head, body) = trickle(&mut slow, head, Duration::from_millis(100)).await;
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    let waited = started.elapsed();
    assert!(waited > Duration::from_secs(5), "cut within the grace");
    assert!(waited < Duration::from_secs(20), "cut late");
    let body = json(&body);
    assert!(
        body["message"].as_str().unwrap().contains("too slowly"),
        "{body}"
    );
}

/// Under a limit of 256 open files, 300 idle connections to `serve` (past its lowered cap, the rest
/// in the listen queue) do not keep `/healthz` from answering: a connection in the reserve past the
/// cap must send its request at once (200 ms), so idle ones pass through it quickly. Before, each held
/// a reserve place for the whole header timeout (10 s).
#[tokio::test]
async fn idle_connections_do_not_starve_serves_health_checks() {
    let (_server, started) = Running::start_command(
        std::process::Command::new("sh")
            .args(["-c", "ulimit -n 256 && exec \"$0\" \"$@\""])
            .arg(env!("CARGO_BIN_EXE_inflight"))
            .args(["serve", "--listen", "127.0.0.1:0", "--workers", "1"])
            .env_clear(),
    );
    let base = listen_of(&started);
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(connect(&base).await);
    }
    for _ in 0..3 {
        let mut health = connect(&base).await;
        send(&mut health, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let (head, _) = answer(&mut health).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    }
    drop(idle);
}

/// A client that reads nothing of a streamed answer is cut once the answer's writes have waited
/// `--send-timeout`, and its permit released (before, a connection had no deadline while its answer
/// ran, so the permit was held for as long as the upstream streamed).
#[tokio::test]
async fn a_client_that_reads_nothing_of_its_answer_is_cut_and_its_permit_released() {
    let upstream = common::Upstream::start().await;
    let mut settings = limits(5, 0);
    settings.connections.send_timeout = Duration::from_millis(500);
    let proxy = start_proxy(
        &common::proxy_settings(&upstream.base, settings),
        Memory::stores(&None),
    )
    .await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let address = proxy.base.trim_start_matches("http://").parse().unwrap();
    let mut deaf = socket.connect(address).await.unwrap();
    send(
        &mut deaf,
        b"GET /flood HTTP/1.1\r\nHost: x\r\nX-Inflight-Key: k\r\n\r\n",
    )
    .await;
    let api = proxy.url("/_inflight");
    common::wait_in_flight(&api, "k", 1).await;
    common::wait_in_flight(&api, "k", 0).await;
}

/// 32 watchers of `/status/events` that read nothing hold every place (the 33rd: 503); each stream
/// ends at `--status-stream-lifetime`, so a new watcher gets its place once they are dropped. Before,
/// they held the places for as long as they stayed connected.
#[tokio::test]
async fn status_watchers_that_read_nothing_give_their_places_back() {
    let mut settings = limits(5, 0);
    settings.workers = Some(1);
    settings.connections.status_stream_lifetime = Duration::from_millis(1500);
    let api = start_api(&settings, Memory::stores(&None)).await;
    let watch = b"GET /status/events HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut deaf = Vec::new();
    for _ in 0..inflight_server::status::MAX_CLIENTS {
        let mut watcher = connect(&api.base).await;
        send(&mut watcher, watch).await;
        let mut peeked = [0u8; 12];
        tokio::time::timeout(Duration::from_secs(5), watcher.peek(&mut peeked))
            .await
            .expect("a watcher's answer begins")
            .unwrap();
        assert_eq!(&peeked, b"HTTP/1.1 200");
        deaf.push(watcher);
    }
    let mut late = connect(&api.base).await;
    send(&mut late, watch).await;
    let (head, body) = answer(&mut late).await;
    assert!(head.starts_with("HTTP/1.1 503"), "{head}");
    assert_eq!(json(&body)["code"], "too_many_status_clients");
    let started = Instant::now();
    loop {
        let mut next = connect(&api.base).await;
        send(&mut next, watch).await;
        let mut peeked = [0u8; 12];
        tokio::time::timeout(Duration::from_secs(5), next.peek(&mut peeked))
            .await
            .expect("an answer")
            .unwrap();
        if &peeked == b"HTTP/1.1 200" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no place was given back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(deaf);
}

/// `Transfer-Encoding: gzip, chunked`: `501 unsupported_transfer_coding` (JSON) from the API and the
/// proxy, nothing forwarded (before, the body was passed on as plain chunks, its coding lost).
#[tokio::test]
async fn a_transfer_coding_other_than_chunked_is_answered_501() {
    let both = Both::start(limits(5, 0)).await;
    for (base, request) in both.posts() {
        let mut client = connect(base).await;
        let head = format!(
            "{request}Host: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\n{{}}\r\n0\r\n\r\n"
        );
        send(&mut client, head.as_bytes()).await;
        let (head, body) = answer(&mut client).await;
        assert!(head.starts_with("HTTP/1.1 501"), "{head}");
        let body = json(&body);
        assert_eq!(body["code"], "unsupported_transfer_coding", "{body}");
    }
    assert_eq!(both.upstream.hits(), 0, "nothing forwarded");
    common::wait_in_flight(&both.proxy.url("/_inflight"), "k", 0).await;
}
