//! The reverse proxy against a real upstream and a real client, on the memory and the Redis store.
#![allow(missing_docs)]

mod common;

use inflight::store::OverrideChange;
use std::time::Duration;

use common::process::{listen_of, Running};
use common::{
    get_json, get_text, limits, metric, proxy_settings, start_proxy, wait_in_flight, Make,
    TestRedis, Upstream,
};
use inflight_server::Settings;
use reqwest::{Client, StatusCode};
use serde_json::Value;

const KEY: &str = "x-inflight-key";

/// `GET url` with the key header.
async fn keyed(http: &Client, url: String, key: &str) -> reqwest::Response {
    http.get(url).header(KEY, key).send().await.unwrap()
}

/// A store, an upstream and a proxy in front of it with these settings.
async fn proxied<M: Make>(args: Settings) -> (Option<TestRedis>, Upstream, common::Server<M::S>) {
    let redis = M::redis();
    let upstream = Upstream::start().await;
    let server = start_proxy(&proxy_settings(&upstream.base, args), M::stores(&redis)).await;
    (redis, upstream, server)
}

async fn requests_are_forwarded_whole<M: Make>() {
    let (_redis, _upstream, server) = proxied::<M>(limits(2, 0)).await;
    let http = Client::new();
    let response = http
        .post(server.url("/echo/a/b?x=1&y=two"))
        .header(KEY, "app-1")
        .header("x-custom", "kept")
        .header("connection", "close, x-drop-me")
        .header("x-drop-me", "hop-by-hop")
        .body("hello upstream")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let echo: Value = response.json().await.unwrap();
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["path"], "/echo/a/b");
    assert_eq!(echo["query"], "x=1&y=two");
    assert_eq!(echo["body"], "hello upstream");
    assert_eq!(echo["headers"]["x-custom"], "kept");
    assert_eq!(echo["headers"][KEY], "app-1");
    assert_eq!(echo["headers"]["x-forwarded-for"], "127.0.0.1");
    assert!(
        echo["headers"].get("x-drop-me").is_none(),
        "headers named by Connection are hop-by-hop"
    );
    wait_in_flight(&server.url("/_inflight"), "app-1", 0).await;
}

async fn no_key_no_forwarding_and_a_full_key_forwards_nothing<M: Make>() {
    let (_redis, upstream, server) = proxied::<M>(limits(1, 0)).await;
    let http = Client::new();
    let missing = http.get(server.url("/echo/x")).send().await.unwrap();
    assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        missing.json::<Value>().await.unwrap()["code"],
        "missing_key"
    );
    // Hold the only slot with a stream, then ask again.
    let stream = keyed(&http, server.url("/sse"), "k").await;
    assert_eq!(stream.status(), StatusCode::OK);
    let hits = upstream.hits();
    let refused = keyed(&http, server.url("/echo/x"), "k").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(
        refused.json::<Value>().await.unwrap()["code"],
        "too_many_requests"
    );
    assert_eq!(upstream.hits(), hits, "nothing was forwarded");
    drop(stream);
}

async fn a_streamed_response_holds_its_slot_for_its_whole_life<M: Make>() {
    // Leases of 300 ms: the stream below lives for several of them.
    let args = Settings {
        lease: Duration::from_millis(300),
        ..limits(1, 0)
    };
    let (_redis, upstream, server) = proxied::<M>(args).await;
    let http = Client::new();
    let mut stream = keyed(&http, server.url("/sse"), "chat").await;
    assert_eq!(stream.headers()["content-type"], "text/event-stream");
    // The first event arrives while the upstream has not produced the second: nothing is buffered.
    assert_eq!(stream.chunk().await.unwrap().unwrap(), "data: 0\n\n");
    for event in 1..3 {
        tokio::time::sleep(Duration::from_millis(400)).await; // more than a lease
        let refused = keyed(&http, server.url("/echo/x"), "chat").await;
        assert_eq!(
            refused.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "the stream still holds its slot"
        );
        upstream.gate.add_permits(1);
        assert_eq!(
            stream.chunk().await.unwrap().unwrap(),
            format!("data: {event}\n\n")
        );
    }
    assert!(stream.chunk().await.unwrap().is_none(), "the stream ended");
    wait_in_flight(&server.url("/_inflight"), "chat", 0).await;
    let after = keyed(&http, server.url("/echo/x"), "chat").await;
    assert_eq!(after.status(), StatusCode::OK);
}

async fn a_client_that_goes_away_frees_the_slot_within_a_second<M: Make>() {
    let (_redis, _upstream, server) = proxied::<M>(limits(1, 0)).await;
    let http = Client::new();
    let mut stream = keyed(&http, server.url("/forever"), "k").await;
    assert!(stream.chunk().await.unwrap().is_some());
    drop(stream);
    drop(http); // closes the connection
    let took = wait_in_flight(&server.url("/_inflight"), "k", 0).await;
    assert!(
        took < Duration::from_secs(1),
        "released {took:?} after the client left"
    );
}

async fn upstream_failures_are_502_or_504_and_release_the_slot<M: Make>() {
    let redis = M::redis();
    // Nothing listens on this port.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let server = start_proxy(&proxy_settings(&dead, limits(1, 0)), M::stores(&redis)).await;
    let http = Client::new();
    let response = keyed(&http, server.url("/x"), "k").await;
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(
        response.json::<Value>().await.unwrap()["code"],
        "upstream_unavailable"
    );
    wait_in_flight(&server.url("/_inflight"), "k", 0).await;

    let upstream = Upstream::start().await;
    let mut args = limits(1, 0);
    args.lease = Duration::from_secs(1);
    let mut settings = proxy_settings(&upstream.base, args);
    settings.upstream_timeout = Duration::from_millis(300);
    let server = start_proxy(&settings, M::stores(&redis)).await;
    let response = keyed(&http, server.url("/slow"), "k2").await;
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(
        response.json::<Value>().await.unwrap()["code"],
        "upstream_timeout"
    );
    wait_in_flight(&server.url("/_inflight"), "k2", 0).await;
}

/// A proxied response's permit is in flight while the response runs, and counts as released once it ends.
async fn a_proxied_response_counts_its_release_when_it_ends<M: Make>() {
    let (_redis, upstream, server) = proxied::<M>(limits(2, 0)).await;
    let http = Client::new();
    let metrics = server.url("/_inflight/metrics");
    let before = metric(&http, &metrics, "inflight_releases_total").await;
    let mut stream = keyed(&http, server.url("/sse"), "k").await;
    assert_eq!(stream.chunk().await.unwrap().unwrap(), "data: 0\n\n");
    assert_eq!(metric(&http, &metrics, "inflight_in_flight").await, 1.0);
    upstream.gate.add_permits(2);
    while stream.chunk().await.unwrap().is_some() {}
    let started = std::time::Instant::now();
    while metric(&http, &metrics, "inflight_releases_total").await <= before {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "no release counted after the response ended"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(metric(&http, &metrics, "inflight_in_flight").await, 0.0);
}

async fn the_api_answers_under_inflight<M: Make>() {
    let (_redis, upstream, server) = proxied::<M>(limits(1, 0)).await;
    let http = Client::new();
    let set = http
        .put(server.url("/_inflight/v1/keys/k/limit"))
        .json(&serde_json::json!({"limit": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), StatusCode::OK);
    let a = keyed(&http, server.url("/sse"), "k").await;
    let b = keyed(&http, server.url("/sse"), "k").await;
    assert_eq!(
        (a.status(), b.status()),
        (StatusCode::OK, StatusCode::OK),
        "the new limit applies"
    );
    let key: Value = get_json(&http, server.url("/_inflight/v1/keys/k")).await;
    assert_eq!(key["in_flight"], 2);
    let metrics = get_text(&http, server.url("/_inflight/metrics")).await;
    assert!(metrics.contains("inflight_in_flight"), "{metrics}");
    assert_eq!(upstream.hits(), 2, "/_inflight is not forwarded");
    // Only the prefix as a whole path segment is the API's.
    let missing = keyed(&http, server.url("/_inflight/nope"), "other").await;
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    assert_eq!(missing.json::<Value>().await.unwrap()["code"], "not_found");
    let lookalike = keyed(&http, server.url("/_inflightx"), "other").await;
    assert_eq!(lookalike.text().await.unwrap(), "no such route upstream");
    assert_eq!(upstream.hits(), 3, "/_inflightx is forwarded");
}

/// HTTP/2 with prior knowledge (h2c), as a load balancer keeping one connection may speak it: forwarded
/// (as HTTP/1.1) and limited as HTTP/1.1 is.
async fn http2_requests_are_forwarded_and_limited<M: Make>() {
    use http_body_util::{BodyExt, Empty};
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let (_redis, upstream, server) = proxied::<M>(limits(1, 0)).await;
    let io = tokio::net::TcpStream::connect(server.base.trim_start_matches("http://"))
        .await
        .unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = |path: &str| {
        http::Request::get(server.url(path))
            .header(KEY, "h2")
            .body(Empty::<bytes::Bytes>::new())
            .unwrap()
    };
    let echo = sender.send_request(request("/echo/h2")).await.unwrap();
    assert_eq!(echo.status(), StatusCode::OK);
    let echo: Value =
        serde_json::from_slice(&echo.into_body().collect().await.unwrap().to_bytes()).unwrap();
    let authority = server.base.trim_start_matches("http://");
    assert_eq!(echo["headers"]["x-forwarded-host"], authority, "{echo}");
    wait_in_flight(&server.url("/_inflight"), "h2", 0).await;
    let stream = sender.send_request(request("/sse")).await.unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    assert_eq!(stream.version(), http::Version::HTTP_2);
    wait_in_flight(&server.url("/_inflight"), "h2", 1).await;
    let refused = sender.send_request(request("/echo/x")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    upstream.gate.add_permits(2);
    let body = stream.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "data: 0\n\ndata: 1\n\ndata: 2\n\n");
    wait_in_flight(&server.url("/_inflight"), "h2", 0).await;
    let status = sender
        .send_request(request("/_inflight/v1/keys/h2"))
        .await
        .unwrap();
    assert_eq!(status.status(), StatusCode::OK);
    assert_eq!(upstream.hits(), 2);
}

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

async fn a_limit_holds_across_workers<M: Make>() {
    let mut args = limits(3, 0);
    args.workers = Some(4);
    let (_redis, upstream, server) = proxied::<M>(args).await;
    // Each client is its own connection, so the kernel spreads them over the four workers.
    let mut streams = Vec::new();
    for _ in 0..3 {
        let stream = keyed(&Client::new(), server.url("/sse"), "k").await;
        assert_eq!(stream.status(), StatusCode::OK);
        streams.push(stream);
    }
    for _ in 0..12 {
        let refused = keyed(&Client::new(), server.url("/echo/x"), "k").await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    }
    upstream.gate.add_permits(3 * 2);
    for mut stream in streams {
        while stream.chunk().await.unwrap().is_some() {}
    }
    wait_in_flight(&server.url("/_inflight"), "k", 0).await;
    for _ in 0..12 {
        let admitted = keyed(&Client::new(), server.url("/echo/x"), "k").await;
        assert_eq!(admitted.status(), StatusCode::OK);
    }
    server.shutdown().await.unwrap();
}

async fn upstream_connections_are_kept_alive_and_replaced_when_closed<M: Make>() {
    let mut args = limits(2, 0);
    args.workers = Some(1); // one worker: one pool of upstream connections
    let (_redis, upstream, server) = proxied::<M>(args).await;
    let http = Client::new();
    for path in ["/echo/x", "/empty", "/echo/y", "/empty", "/sse"] {
        if path == "/sse" {
            upstream.gate.add_permits(2);
        }
        let response = keyed(&http, server.url(path), "k").await;
        assert!(response.status().is_success(), "{path}");
        response.bytes().await.unwrap();
    }
    assert_eq!(upstream.connections(), 1, "one kept-alive connection");

    // The upstream closes its end after answering: the next request goes on a new connection.
    let closing = keyed(&http, server.url("/close"), "k").await;
    assert_eq!(closing.text().await.unwrap(), "closing");
    let after = keyed(&http, server.url("/echo/x"), "k").await;
    assert_eq!(after.status(), StatusCode::OK);
    assert_eq!(upstream.connections(), 2);

    // A response the client left mid-stream: its connection is closed, not given back (hyper would refuse
    // to send on it anyway), and the next request goes on a new one.
    let mut forever = keyed(&Client::new(), server.url("/forever"), "k").await;
    assert!(forever.chunk().await.unwrap().is_some());
    drop(forever);
    wait_in_flight(&server.url("/_inflight"), "k", 0).await;
    let after = keyed(&http, server.url("/echo/x"), "k").await;
    assert_eq!(after.status(), StatusCode::OK);
    assert_eq!(upstream.connections(), 3);
    wait_in_flight(&server.url("/_inflight"), "k", 0).await;
}

/// The proxy checks its key header as the API checks a key in its path: a tab, which a header value may
/// hold, is a control character, and such a key is refused by both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_with_a_tab_is_refused_by_the_proxy_as_by_the_api() {
    let (_redis, upstream, server) = proxied::<common::Memory>(limits(2, 0)).await;
    let http = Client::new();
    let proxied = keyed(&http, server.url("/echo/x"), "a\tb").await;
    assert_eq!(proxied.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        proxied.json::<Value>().await.unwrap()["code"],
        "invalid_key"
    );
    assert_eq!(upstream.hits(), 0, "nothing was forwarded");
    let api = http
        .post(server.url("/_inflight/v1/keys/a%09b/permits"))
        .send()
        .await
        .unwrap();
    assert_eq!(api.status(), StatusCode::BAD_REQUEST);
    assert_eq!(api.json::<Value>().await.unwrap()["code"], "invalid_key");
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

/// Each request on a kept-alive upstream connection gets the whole upstream timeout for its response
/// headers, and no more, however long the connection was idle before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_on_a_kept_alive_connection_gets_the_whole_upstream_timeout() {
    let upstream = Upstream::start().await;
    let mut args = limits(2, 0);
    args.workers = Some(1); // one pool, one connection
    let mut settings = proxy_settings(&upstream.base, args);
    settings.upstream_timeout = Duration::from_secs(1);
    let server = start_proxy(&settings, common::Memory::stores(&None)).await;
    let http = Client::new();
    let status = |response: reqwest::Response| response.status();
    assert_eq!(
        status(keyed(&http, server.url("/delay/0"), "k").await),
        StatusCode::OK
    );
    // An answer that comes after the first request's deadline, within its own.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let late = keyed(&http, server.url("/delay/600"), "k").await;
    assert_eq!(late.text().await.unwrap(), "late, but answered");
    // Idle for longer than the timeout; then used again.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        status(keyed(&http, server.url("/delay/0"), "k").await),
        StatusCode::OK
    );
    assert_eq!(upstream.connections(), 1, "all of them on one connection");
    let slow = keyed(&http, server.url("/slow"), "k").await;
    assert_eq!(slow.status(), StatusCode::GATEWAY_TIMEOUT);
    wait_in_flight(&server.url("/_inflight"), "k", 0).await;
}

/// An upstream named by host: every address the name has is tried (here `localhost`, whose IPv6 address
/// may come first and refuse, as the upstream listens on 127.0.0.1 only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_named_by_host_is_reached_on_any_of_its_addresses() {
    let upstream = Upstream::start().await;
    let named = upstream.base.replace("127.0.0.1", "localhost");
    let settings = proxy_settings(&named, limits(2, 0));
    let server = start_proxy(&settings, common::Memory::stores(&None)).await;
    let response = keyed(&Client::new(), server.url("/echo/x"), "k").await;
    assert_eq!(response.status(), StatusCode::OK);
    let echo: Value = response.json().await.unwrap();
    assert_eq!(echo["headers"]["host"], named.trim_start_matches("http://"));
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

per_store!(
    a_proxied_response_counts_its_release_when_it_ends,
    requests_are_forwarded_whole,
    upstream_connections_are_kept_alive_and_replaced_when_closed,
    a_limit_holds_across_workers,
    no_key_no_forwarding_and_a_full_key_forwards_nothing,
    a_streamed_response_holds_its_slot_for_its_whole_life,
    a_client_that_goes_away_frees_the_slot_within_a_second,
    upstream_failures_are_502_or_504_and_release_the_slot,
    the_api_answers_under_inflight,
    http2_requests_are_forwarded_and_limited,
    shutdown_lets_running_streams_finish,
    shutdown_releases_what_outlives_the_grace_period,
);

/// An upstream that answers every request with both `Transfer-Encoding: chunked` and a wrong
/// `Content-Length`: the encoding decides the length (RFC 9112 6.3), so the proxy must drop the other.
async fn te_and_cl_upstream() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut seen = Vec::new();
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                let answer =
                    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n\
                              5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
                let _ = socket.write_all(answer.as_bytes()).await;
            });
        }
    });
    base
}

#[tokio::test]
async fn a_chunked_answer_loses_its_content_length_and_connect_is_refused() {
    let upstream = te_and_cl_upstream().await;
    let stores = common::Memory::stores(&None);
    let server = start_proxy(&proxy_settings(&upstream, limits(2, 0)), stores).await;
    let http = Client::new();
    for _ in 0..2 {
        let response = keyed(&http, server.url("/anything"), "k").await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_ne!(
            response
                .headers()
                .get("content-length")
                .map(|v| v.as_bytes()),
            Some(&b"3"[..]),
            "the upstream's wrong length is not forwarded"
        );
        assert_eq!(response.text().await.unwrap(), "hello world");
    }
    // CONNECT and TRACE are not forwarded: raw, since a client library would make CONNECT a tunnel.
    for method in ["CONNECT 127.0.0.1:1 HTTP/1.1", "TRACE / HTTP/1.1"] {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let address = server.url("").trim_start_matches("http://").to_owned();
        let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
        let request =
            format!("{method}\r\nHost: 127.0.0.1\r\n{KEY}: k\r\nConnection: close\r\n\r\n");
        socket.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        socket.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 405"), "{method}: {answer}");
        assert!(answer.contains("method_not_allowed"), "{answer}");
    }
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
