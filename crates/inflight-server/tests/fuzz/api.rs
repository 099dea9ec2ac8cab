//! The API's routes in-process (paths, headers, JSON bodies), and whole requests written raw on a socket
//! to a running `serve` (what hyper reads, and refuses, before any route).

use std::time::Duration;

use axum::Router;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower_service::Service;

use crate::common::{self, Make, Memory};

/// One request to the API's routes.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct Request {
    method: String,
    path: String,
    #[serde(default)]
    headers: Vec<(String, String)>,
    #[serde(default)]
    body: String,
}

/// The settings the fuzzed servers run with: small limits, short timeouts (a case that leaves a request
/// unfinished ends soon).
fn settings() -> inflight_server::Settings {
    let mut settings = common::limits(3, 10);
    settings.max_overrides = 1000;
    settings.workers = Some(1);
    let short = Duration::from_millis(200);
    settings.connections.header_timeout = short;
    settings.connections.idle_timeout = short;
    settings.connections.body_timeout = short;
    settings
}

/// The API's router over a memory store, as a worker has it.
pub(crate) fn router(runtime: &tokio::runtime::Runtime) -> Router {
    let settings = settings();
    let shared = inflight_server::Shared::new(&settings).expect("valid settings");
    let _entered = runtime.enter();
    let app = inflight_server::app(&settings, &shared, inflight::MemoryStore::new().into())
        .expect("an app");
    inflight_server::api::router(app)
}

/// A running `serve` (in-process, memory store).
pub(crate) async fn server() -> common::Server<inflight::MemoryStore> {
    common::start_api(&settings(), Memory::stores(&None)).await
}

/// What the routes take: a route with hostile segments, or any path.
pub(crate) fn path() -> impl Strategy<Value = String> {
    const ROUTES: &[&str] = &[
        "/v1/keys/{}/permits",
        "/v1/keys/{}/permits/{}",
        "/v1/permits",
        "/v1/permits/{}",
        "/v1/keys/{}",
        "/v1/keys/{}/limit",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
    ];
    let route = (prop::sample::select(ROUTES), segment(), segment())
        .prop_map(|(route, a, b)| route.replacen("{}", &a, 1).replacen("{}", &b, 1));
    let query = prop::option::of("[a-z0-9=&%]{0,12}");
    prop_oneof![
        3 => (route, query).prop_map(|(path, query)| match query {
            Some(query) => format!("{path}?{query}"),
            None => path,
        }),
        1 => "(/[a-zA-Z0-9%._~:-]{0,8}){0,5}",
    ]
}

/// A path segment (a key, an id): plain, any text percent-encoded, or a known nasty one.
pub(crate) fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-zA-Z0-9:_.*-]{0,12}",
        4 => any::<String>().prop_map(|text| encode(&text)),
        2 => prop::sample::select(&[
            "", "%", "%zz", "%00", "%C3", "%C3%28", "..", ".", "%2F", "%2e%2e", "a%09b", "a%0Ab",
            "%7F", "%20", "*", "~", "%EF%BF%BF",
        ][..]).prop_map(String::from),
        1 => (250usize..=270).prop_map(|n| "k".repeat(n)),
    ]
}

/// `text` with every byte but the unreserved ones percent-encoded.
pub(crate) fn encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(byte).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// A JSON value of any shape, with the numbers the API's fields care about.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        prop::sample::select(
            &[
                0u64,
                1,
                16,
                17,
                86_400_000,
                86_400_001,
                4_294_967_295,
                4_294_967_296
            ][..]
        )
        .prop_map(Value::from),
        segment().prop_map(Value::from),
        any::<String>().prop_map(Value::from),
    ];
    leaf.prop_recursive(2, 24, 20, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..20).prop_map(Value::Array),
            prop::collection::btree_map(field(), inner, 0..4)
                .prop_map(|fields| Value::Object(fields.into_iter().collect())),
        ]
    })
}

/// A field of a body: the API's, or not.
fn field() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(&["id", "weight", "lease_ms", "keys", "limit"][..]).prop_map(String::from),
        1 => "[a-z_]{0,8}",
    ]
}

/// A body: empty, a JSON object of the API's fields, or any text.
fn body() -> impl Strategy<Value = String> {
    prop_oneof![
        1 => Just(String::new()),
        4 => prop::collection::btree_map(field(), json_value(), 0..4)
            .prop_map(|fields| Value::Object(fields.into_iter().collect()).to_string()),
        1 => any::<String>(),
        1 => json_value().prop_map(|value| value.to_string()),
    ]
}

/// Headers: the ones the API reads, and others.
fn headers() -> impl Strategy<Value = Vec<(String, String)>> {
    let name = prop_oneof![
        3 => prop::sample::select(&[
            "authorization", "content-type", "content-length", "transfer-encoding", "expect",
            "x-inflight-key", "accept",
        ][..]).prop_map(String::from),
        1 => "[a-z][a-z0-9-]{0,15}",
    ];
    let value = prop_oneof![
        "[ -~]{0,30}",
        "(Bearer|bearer|BEARER|Basic) ?[ -~]{0,20}",
        "[0-9]{1,12}",
        Just("application/json".to_owned()),
    ];
    prop::collection::vec((name, value), 0..6)
}

/// Requests to the API.
pub(crate) fn requests() -> impl Strategy<Value = Request> {
    let method = prop_oneof![
        6 => prop::sample::select(&["GET", "POST", "PUT", "DELETE"][..]).prop_map(String::from),
        1 => prop::sample::select(&["HEAD", "OPTIONS", "PATCH", "TRACE", "CONNECT", "FROB"][..])
            .prop_map(String::from),
    ];
    (method, path(), headers(), body()).prop_map(|(method, path, headers, body)| Request {
        method,
        path,
        headers,
        body,
    })
}

/// A route's answer to `case` keeps the promises.
pub(crate) async fn check_route(router: &Router, case: Request) -> Result<(), TestCaseError> {
    let mut request = http::Request::builder()
        .method(case.method.as_str())
        .uri(case.path.as_str());
    for (name, value) in &case.headers {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_str(value),
        ) {
            request = request.header(name, value);
        }
    }
    // A method or URI the http crate refuses cannot reach a route (hyper refuses it first).
    let Ok(request) = request.body(axum::body::Body::from(case.body)) else {
        return Ok(());
    };
    let head = request.method() == http::Method::HEAD;
    let response = match router.clone().call(request).await {
        Ok(response) => response,
        Err(infallible) => match infallible {},
    };
    let status = response.status().as_u16();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .map_err(|e| TestCaseError::fail(format!("the answer's body: {e}")))?;
    check_answer(status, &body, head)
}

/// No 5xx but 502/503/504, and 501 for a transfer coding other than chunked; a refusal (4xx, 5xx) is
/// JSON with its code and status.
pub(crate) fn check_answer(status: u16, body: &[u8], head: bool) -> Result<(), TestCaseError> {
    let text = String::from_utf8_lossy(body);
    // (A HEAD answer has no body to say its code.)
    let unsupported_coding =
        status == 501 && (head || text.contains(r#""code":"unsupported_transfer_coding""#));
    prop_assert!(
        status < 500 || (502..=504).contains(&status) || unsupported_coding,
        "status {}: {}",
        status,
        text
    );
    if status >= 400 && !head {
        let json: Value = serde_json::from_slice(body).map_err(|e| {
            TestCaseError::fail(format!("a {status} whose body is not JSON ({e}): {text:?}"))
        })?;
        prop_assert!(
            json["code"].as_str().is_some_and(|code| !code.is_empty()),
            "no code: {}",
            json
        );
        prop_assert_eq!(json["status"].clone(), json!(status));
        prop_assert!(json["message"].is_string(), "no message: {}", json);
    }
    Ok(())
}

/// Whole requests as bytes: a request line, headers and a body, each part well-formed or not.
pub(crate) fn raw() -> impl Strategy<Value = Vec<u8>> {
    let method = prop_oneof![
        4 => prop::sample::select(&["GET", "POST", "PUT", "DELETE", "HEAD", "CONNECT", "OPTIONS"][..])
            .prop_map(String::from),
        1 => "[A-Za-z]{0,8}",
        1 => "[ -~]{0,6}",
    ];
    let target = prop_oneof![
        4 => path(),
        1 => "[ -~]{0,30}",
        1 => prop::sample::select(&["*", "http://x/healthz", "x:80", "//healthz", ""][..])
            .prop_map(String::from),
    ];
    let version = prop::sample::select(
        &[
            "HTTP/1.1",
            "HTTP/1.1",
            "HTTP/1.0",
            "HTTP/2.0",
            "HTTP/1.2",
            "http/1.1",
            "HTTP/1.1 ",
            "",
        ][..],
    );
    let name = prop_oneof![
        3 => prop::sample::select(&[
            "Host", "Content-Length", "Transfer-Encoding", "Connection", "Expect", "Authorization",
            "Content-Type",
        ][..]).prop_map(|name| name.as_bytes().to_vec()),
        1 => "[A-Za-z-]{1,12}".prop_map(String::into_bytes),
        1 => prop::collection::vec(any::<u8>(), 0..8),
    ];
    let value = prop_oneof![
        3 => "[ -~]{0,20}".prop_map(String::into_bytes),
        2 => prop::sample::select(&["chunked", "gzip, chunked", "close", "keep-alive", "100-continue", "0", "5", "-1", "1, 2"][..])
            .prop_map(|value| value.as_bytes().to_vec()),
        1 => prop::collection::vec(any::<u8>(), 0..8),
    ];
    let headers = prop::collection::vec((name, value), 0..8);
    let body = prop_oneof![
        Just(Vec::new()),
        prop::collection::vec(any::<u8>(), 0..40),
        Just(b"5\r\nhello\r\n0\r\n\r\n".to_vec()),
        Just(b"zz\r\nhello\r\n".to_vec()),
    ];
    (method, target, version, headers, body, any::<bool>()).prop_map(
        |(method, target, version, headers, body, sized)| {
            let mut bytes = format!("{method} {target} {version}\r\n").into_bytes();
            for (name, value) in headers {
                bytes.extend_from_slice(&name);
                bytes.extend_from_slice(b": ");
                bytes.extend_from_slice(&value);
                bytes.extend_from_slice(b"\r\n");
            }
            if sized {
                bytes.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
            }
            bytes.extend_from_slice(b"\r\n");
            bytes.extend_from_slice(&body);
            bytes
        },
    )
}

/// Writes `bytes` to the server at `base` and checks every answer that comes back.
pub(crate) async fn check_raw(base: &str, bytes: Vec<u8>) -> Result<(), TestCaseError> {
    let mut stream = common::raw::connect(base).await;
    if stream.write_all(&bytes).await.is_err() {
        return Ok(()); // closed before it all went: nothing to check
    }
    let mut answers = Vec::new();
    let mut chunk = [0u8; 16384];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        // Until the server closes, or is quiet a while once an answer is in (it waits for more).
        let quiet = match complete(&answers) {
            true => Duration::from_millis(30),
            false => Duration::from_secs(3),
        };
        match tokio::time::timeout(quiet, stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(n)) => answers.extend_from_slice(&chunk[..n]),
        }
        prop_assert!(
            tokio::time::Instant::now() < deadline,
            "the server kept talking"
        );
    }
    let head_request = bytes.starts_with(b"HEAD ");
    let mut rest = &answers[..];
    while !rest.is_empty() {
        let Some(end) = rest.windows(4).position(|w| w == b"\r\n\r\n") else {
            return Err(TestCaseError::fail(format!(
                "a truncated answer: {:?}",
                String::from_utf8_lossy(rest)
            )));
        };
        let head = String::from_utf8_lossy(&rest[..end]).to_string();
        let status: u16 = head
            .get(9..12)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| TestCaseError::fail(format!("not an answer: {head:?}")))?;
        let length = head
            .lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse::<usize>().ok())?
            })
            .unwrap_or(0);
        let length = if head_request || status < 200 {
            0
        } else {
            length
        };
        let body = &rest[end + 4..(end + 4 + length).min(rest.len())];
        if status >= 200 {
            check_answer(status, body, head_request)?;
        }
        rest = &rest[(end + 4 + length).min(rest.len())..];
        if head_request {
            break;
        }
    }
    Ok(())
}

/// True when `bytes` hold at least one whole answer head.
fn complete(bytes: &[u8]) -> bool {
    bytes.windows(4).any(|w| w == b"\r\n\r\n")
}
