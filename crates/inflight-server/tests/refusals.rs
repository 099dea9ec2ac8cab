//! Every refusal is JSON `{"code","message","status"}`, hyper's own included: requests hyper cannot read
//! (too long a URI, too many or too large headers, malformed framing), written on raw sockets. Each test
//! is a row of RELIABILITY.md.
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::raw::{answer, answers_to_the_end, closed_within, connect, json, send};
use common::{limits, start_api, start_proxy, Make, Memory};

/// Requests hyper refuses by itself, and the status and code of each refusal.
fn unreadable() -> Vec<(&'static str, Vec<u8>, u16, &'static str)> {
    let long_uri = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000));
    let many: String = (0..101).map(|n| format!("X-H{n}: v\r\n")).collect();
    let many_headers = format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{many}\r\n");
    vec![
        (
            "a 70,000-byte URI",
            long_uri.into_bytes(),
            414,
            "uri_too_long",
        ),
        (
            "101 headers",
            many_headers.into_bytes(),
            431,
            "headers_too_large",
        ),
        (
            "a header name with a space",
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header: x\r\n\r\n".to_vec(),
            400,
            "bad_request",
        ),
        (
            "two Content-Lengths that disagree",
            b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"
                .to_vec(),
            400,
            "bad_request",
        ),
        (
            "a Content-Length that is no number",
            b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n".to_vec(),
            400,
            "bad_request",
        ),
        (
            "a chunked body under HTTP/1.0",
            b"POST /x HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".to_vec(),
            400,
            "bad_request",
        ),
        (
            "no request line",
            b"HELLO\r\n\r\n".to_vec(),
            400,
            "bad_request",
        ),
    ]
}

/// Sends each unreadable request on a connection of its own to `base`: the refusal is JSON with its
/// stable code, says `Connection: close`, and the connection closes.
async fn refusals_are_json(base: &str) {
    for (what, request, status, code) in unreadable() {
        let mut client = connect(base).await;
        send(&mut client, &request).await;
        let (head, body) = answer(&mut client).await;
        assert!(
            head.starts_with(&format!("HTTP/1.1 {status} ")),
            "{what}: {head}"
        );
        let lower = head.to_ascii_lowercase();
        assert!(
            lower.contains("content-type: application/json"),
            "{what}: {head}"
        );
        assert!(lower.contains("connection: close"), "{what}: {head}");
        let body = json(&body);
        assert_eq!(body["code"], code, "{what}: {body}");
        assert_eq!(body["status"], status, "{what}: {body}");
        assert!(
            body["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}"
        );
        assert!(
            closed_within(&mut client, Duration::from_secs(3)).await,
            "{what}: left open"
        );
    }
}

#[tokio::test]
async fn the_apis_refusals_of_unreadable_requests_are_json() {
    let server = start_api(&limits(5, 0), Memory::stores(&None)).await;
    refusals_are_json(&server.base).await;
}

#[tokio::test]
async fn the_proxys_refusals_of_unreadable_requests_are_json_and_nothing_goes_upstream() {
    let upstream = common::Upstream::start().await;
    let settings = common::proxy_settings(&upstream.base, limits(5, 0));
    let server = start_proxy(&settings, Memory::stores(&None)).await;
    refusals_are_json(&server.base).await;
    assert_eq!(upstream.hits(), 0);
}

/// Answers on a kept-alive connection are left as they are; an unreadable request pipelined after them
/// is refused in JSON, or, when hyper reads it while it still writes an answer, the connection is closed
/// after that answer with nothing more (hyper's choice: it writes no refusal then). Never an empty one.
#[tokio::test]
async fn a_refusal_after_pipelined_answers_leaves_them_as_they_are() {
    let upstream = common::Upstream::start().await;
    let settings = common::proxy_settings(&upstream.base, limits(5, 0));
    let server = start_proxy(&settings, Memory::stores(&None)).await;
    for good in [
        "GET /_inflight/healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        "GET /echo/a HTTP/1.1\r\nHost: x\r\nX-Inflight-Key: k\r\n\r\n",
    ] {
        let mut client = connect(&server.base).await;
        let pipelined = format!("{good}{good}GET / HTTP/1.1\r\nBad Header: x\r\n\r\n");
        send(&mut client, pipelined.as_bytes()).await;
        // Read to the end: the answers may come in one segment, which reading them one by one would cut.
        let answers = answers_to_the_end(&mut client).await;
        assert!((2..=3).contains(&answers.len()), "{answers:?}");
        for (head, body) in &answers[..2] {
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            json(body);
        }
        if let Some((head, body)) = answers.get(2) {
            assert!(head.starts_with("HTTP/1.1 400"), "{head}");
            assert_eq!(json(body)["code"], "bad_request");
        }
    }
}
