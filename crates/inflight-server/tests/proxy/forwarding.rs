//! Requests forwarded whole and limited: keys, streams, clients that go away, failures of the
//! upstream, HTTP/2, the API under the proxy, and workers sharing a limit.

use std::time::Duration;

use inflight_server::Settings;
use reqwest::{Client, StatusCode};
use serde_json::Value;

use crate::common;
use crate::common::{
    get_json, get_text, limits, metric, proxy_settings, start_proxy, wait_in_flight, Make,
    Refusing, Upstream,
};
use crate::per_store;
use crate::{keyed, proxied, KEY};

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
    // The refusing limit named (a key of no rule's class: the default class).
    assert_eq!(
        refused.headers()["inflight-limit"],
        r#"key="k"; class="default"; limit=1; in_flight=1"#
    );
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
    // Nothing listens on this port (and no other test is given it while this one runs).
    let refusing = Refusing::new();
    let dead = refusing.base.clone();
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

per_store!(
    a_proxied_response_counts_its_release_when_it_ends,
    requests_are_forwarded_whole,
    a_limit_holds_across_workers,
    no_key_no_forwarding_and_a_full_key_forwards_nothing,
    a_streamed_response_holds_its_slot_for_its_whole_life,
    a_client_that_goes_away_frees_the_slot_within_a_second,
    upstream_failures_are_502_or_504_and_release_the_slot,
    the_api_answers_under_inflight,
    http2_requests_are_forwarded_and_limited,
);
