//! The connections to the upstream, kept alive and replaced, its timeout and its addresses, and
//! an answer whose framing the proxy must fix.

use std::time::Duration;

use reqwest::{Client, StatusCode};
use serde_json::Value;

use crate::common;
use crate::common::{limits, proxy_settings, start_proxy, wait_in_flight, Make, Upstream};
use crate::per_store;
use crate::{keyed, proxied, KEY};

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

per_store!(upstream_connections_are_kept_alive_and_replaced_when_closed,);
