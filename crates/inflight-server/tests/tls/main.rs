//! TLS on the served port, with self-signed certificates and real clients: HTTP/2 negotiated by ALPN
//! (many streamed requests on one connection, each holding its own slot), HTTP/1.1, the certificate
//! reloaded for new connections, bad files refused by name, and handshakes bounded in time.
#![allow(missing_docs)]

#[path = "../common/mod.rs"]
mod common;
mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{limits, proxy_settings, Upstream};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use inflight_server::config::Layered;
use inflight_server::Settings;
use rustls::pki_types::ServerName;
use serde_json::Value;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Browsers open one HTTP/2 connection per host and send every request on it: 20 streamed answers at
/// once on one connection are 20 permits, a 21st is refused, and all are released when the streams end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_over_tls_runs_20_streams_on_one_connection_each_holding_its_slot() {
    let files = Files::new();
    let upstream = Upstream::start().await;
    let mut serve = limits(20, 0);
    serve.tls = files.settings();
    let proxy = proxy_settings(&upstream.base, serve);
    let server = Server::start(&proxy.serve, Some(&proxy)).await;

    let tls = connect(server.addr, &files.der, &[b"h2", b"http/1.1"]).await;
    assert_eq!(alpn(&tls).as_deref(), Some(&b"h2"[..]), "ALPN chose h2");
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(connection);

    // The upstream hears that the client came over TLS.
    let (status, echo) = h2_get(&mut sender, "/echo/proto").await;
    assert_eq!(status, http::StatusCode::OK);
    let echo: Value = serde_json::from_slice(&echo).unwrap();
    assert_eq!(echo["headers"]["x-forwarded-proto"], "https", "{echo}");

    let mut streams = Vec::new();
    for _ in 0..20 {
        let mut sender = sender.clone();
        streams.push(tokio::spawn(async move {
            let response = sender.send_request(get("/sse", "chat")).await.unwrap();
            assert_eq!(response.status(), http::StatusCode::OK);
            assert_eq!(response.version(), http::Version::HTTP_2);
            let mut body = response.into_body();
            let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
            assert_eq!(first, "data: 0\n\n");
            body
        }));
    }
    let mut bodies = Vec::new();
    for stream in streams {
        bodies.push(tokio::time::timeout(WAIT, stream).await.unwrap().unwrap());
    }
    assert_eq!(in_flight(&mut sender, "chat").await, 20, "20 slots held");
    let refused = sender.send_request(get("/sse", "chat")).await.unwrap();
    assert_eq!(refused.status(), http::StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(upstream.hits(), 1 + 20, "the 21st was not forwarded");

    upstream.gate.add_permits(2 * 20);
    for body in bodies {
        let rest = tokio::time::timeout(WAIT, body.collect()).await.unwrap();
        assert_eq!(rest.unwrap().to_bytes(), "data: 1\n\ndata: 2\n\n");
    }
    wait_in_flight(&mut sender, "chat", 0).await;
    server.shutdown().await;
}

/// HTTP/1.1 over TLS: `serve`'s API answers (on one kept-alive connection), and a request hyper cannot
/// read is refused in JSON there as in plain HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_over_tls_serves_the_api_and_refuses_in_json() {
    let files = Files::new();
    let mut settings = limits(3, 0);
    settings.tls = files.settings();
    let server = Server::start(&settings, None).await;

    let tls = connect(server.addr, &files.der, &[b"http/1.1"]).await;
    assert_eq!(alpn(&tls).as_deref(), Some(&b"http/1.1"[..]));
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(connection);
    for path in ["/healthz", "/v1/keys/k"] {
        let request = http::Request::get(path)
            .header("host", "localhost")
            .body(Empty::<Bytes>::new())
            .unwrap();
        sender.ready().await.unwrap();
        let response = sender.send_request(request).await.unwrap();
        assert_eq!(response.status(), http::StatusCode::OK, "{path}");
        assert_eq!(response.version(), http::Version::HTTP_11);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        if path == "/v1/keys/k" {
            let status: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(status["limit"], 3, "{status}");
            assert_eq!(status["in_flight"], 0, "{status}");
        }
    }

    // No ALPN at all (an older client): HTTP/1.1, and hyper's refusal of what it cannot read is JSON.
    let mut tls = connect(server.addr, &files.der, &[]).await;
    assert_eq!(alpn(&tls), None);
    tls.write_all(b"HELLO\r\n\r\n").await.unwrap();
    let answer = read_to_close(&mut tls).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    let body = &answer[answer.find("\r\n\r\n").expect("a head") + 4..];
    let refusal: Value = serde_json::from_str(body).unwrap();
    assert_eq!(refusal["code"], "bad_request", "{refusal}");
    assert_eq!(refusal["status"], 400, "{refusal}");
    server.shutdown().await;
}

/// What SIGHUP does with TLS: the files read again, new connections get the new certificate, open ones
/// keep working with theirs; a bad file keeps the certificate in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_gives_new_connections_the_new_certificate() {
    let files = Files::new();
    let old = files.der.clone();
    let mut settings = limits(0, 0);
    settings.tls = files.settings();
    let server = Server::start(&settings, None).await;

    let before = connect(server.addr, &old, &[b"http/1.1"]).await;
    assert_eq!(peer_cert(&before), old);
    let (mut kept, connection) = hyper::client::conn::http1::handshake(TokioIo::new(before))
        .await
        .unwrap();
    tokio::spawn(connection);
    healthz(&mut kept).await;

    let files = files.renewed();
    assert_ne!(files.der, old, "a new certificate");
    server.tls.reload(&files.settings()).unwrap();
    let after = connect(server.addr, &files.der, &[b"http/1.1"]).await;
    assert_eq!(
        peer_cert(&after),
        files.der,
        "a new connection has the new certificate"
    );
    healthz(&mut kept).await;

    // A bad file: refused by name, and the certificate in force stays.
    std::fs::write(files.cert(), "not a certificate").unwrap();
    let error = server.tls.reload(&files.settings()).unwrap_err();
    assert_eq!(error.setting, "tls_cert", "{error}");
    let again = connect(server.addr, &files.der, &[b"http/1.1"]).await;
    assert_eq!(peer_cert(&again), files.der);
    healthz(&mut kept).await;
    drop((after, again, kept));
    server.shutdown().await;
}

/// The error of `serve`'s settings with these TLS flags.
fn tls_error(cert: Option<&Path>, key: Option<&Path>) -> inflight_server::ConfigError {
    let mut flags = vec!["inflight".to_owned()];
    for (flag, path) in [("--tls-cert", cert), ("--tls-key", key)] {
        if let Some(path) = path {
            flags.extend([flag.to_owned(), path.display().to_string()]);
        }
    }
    Settings::from_flags(flags).expect_err("bad TLS settings")
}

/// Bad TLS settings are errors at start that name the setting: one file without the other, a file
/// missing, a file with no PEM in it, a key that is not the certificate's.
#[test]
fn bad_tls_files_are_config_errors_naming_the_setting() {
    let files = Files::new();
    let other = Files::new();
    let garbage = files.dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not PEM at all").unwrap();
    let missing = files.dir.path().join("missing.pem");
    let cases: [(Option<&Path>, Option<&Path>, &str, &str); 6] = [
        (Some(&files.cert()), None, "tls_key", "needs --tls-key"),
        (None, Some(&files.key()), "tls_cert", "needs --tls-cert"),
        (
            Some(&missing),
            Some(&files.key()),
            "tls_cert",
            "missing.pem",
        ),
        (
            Some(&garbage),
            Some(&files.key()),
            "tls_cert",
            "no PEM certificate",
        ),
        (
            Some(&files.cert()),
            Some(&garbage),
            "tls_key",
            "garbage.pem",
        ),
        (
            Some(&files.cert()),
            Some(&other.key()),
            "tls_key",
            "key.pem",
        ),
    ];
    for (cert, key, setting, says) in cases {
        let error = tls_error(cert, key);
        assert_eq!(error.setting, setting, "{error}");
        assert!(error.to_string().contains(says), "{error}");
    }
    let mut flags = vec!["inflight".to_owned()];
    flags.extend(["--tls-cert".to_owned(), files.cert().display().to_string()]);
    flags.extend(["--tls-key".to_owned(), files.key().display().to_string()]);
    let settings = Settings::from_flags(flags).expect("good files");
    assert!(settings.tls.server_config().unwrap().is_some());
}

/// A client that opens a connection and never sends its ClientHello is closed once `--header-timeout`
/// is over; meanwhile it holds its place under `--max-connections`, as any connection does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_says_hello_is_closed_after_the_handshake_timeout() {
    let files = Files::new();
    let upstream = Upstream::start().await;
    let mut serve = limits(0, 0);
    serve.tls = files.settings();
    serve.connections.header_timeout = Duration::from_secs(2);
    serve.connections.max_connections = 1;
    // One listener, whose queue is accepted in order: the silent client first.
    serve.workers = Some(1);
    // The proxy: its port has no reserve past the cap (serve's answers health checks there).
    let proxy = proxy_settings(&upstream.base, serve);
    let server = Server::start(&proxy.serve, Some(&proxy)).await;

    let opened = Instant::now();
    let mut silent = TcpStream::connect(server.addr).await.unwrap();
    // The only place is the silent client's: another client's handshake waits for it.
    let (addr, der) = (server.addr, files.der.clone());
    let waiting = tokio::spawn(async move {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        client(&der, &[b"h2"]).connect(name, tcp).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "the silent client holds the only place"
    );

    let mut chunk = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut chunk)).await;
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "the silent client was closed: {read:?}"
    );
    assert!(opened.elapsed() < Duration::from_secs(10));
    let next = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the next client gets the place")
        .unwrap()
        .expect("its handshake succeeds");
    assert_eq!(peer_cert(&next), files.der);
    drop(next);
    server.shutdown().await;
}

/// The binary: `inflight proxy --tls-cert --tls-key` serves TLS on its proxied port, its admin listener
/// stays plain HTTP, and SIGHUP puts a renewed certificate in force for new connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_tls_and_reloads_its_certificate_on_sighup() {
    use common::process::{admin_of, listen_of, Running};

    let files = Files::new();
    let (cert, key) = (files.cert(), files.key());
    let args = [
        "proxy",
        "--upstream",
        "http://127.0.0.1:9",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ];
    let (server, started_line) = Running::start(&args);
    assert!(started_line.contains("tls=true"), "{started_line}");
    let addr: SocketAddr = listen_of(&started_line).parse().unwrap();
    let first = connect(addr, &files.der, &[b"h2"]).await;
    assert_eq!(peer_cert(&first), files.der);
    let admin = format!("http://{}/healthz", admin_of(&started_line));
    let health = reqwest::get(&admin).await.unwrap();
    assert_eq!(
        health.status(),
        reqwest::StatusCode::OK,
        "the admin listener is plain HTTP"
    );

    let files = files.renewed();
    server.signal("-HUP");
    let started = Instant::now();
    loop {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        // Trusting only the new certificate: the handshake fails until it is in force.
        let connected = client(&files.der, &[b"h2"]).connect(name, tcp).await;
        if let Ok(tls) = connected {
            assert_eq!(peer_cert(&tls), files.der);
            break;
        }
        assert!(
            started.elapsed() < WAIT,
            "the new certificate is not in force"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(first);

    // A client that speaks plain HTTP to the TLS port is closed in its handshake, and counted.
    let metrics = format!("http://{}/metrics", admin_of(&started_line));
    let failures = || async {
        let text = reqwest::get(&metrics).await.unwrap().text().await.unwrap();
        let line = "inflight_tls_handshake_failures_total{reason=\"error\"} ";
        text.lines()
            .find_map(|l| l.strip_prefix(line))
            .map_or(0.0, |n| n.parse::<f64>().unwrap())
    };
    let before = failures().await;
    let text = reqwest::get(&metrics).await.unwrap().text().await.unwrap();
    for exported in [
        "# HELP inflight_tls_handshake_failures_total ",
        "inflight_tls_handshake_failures_total{reason=\"timeout\"} 0",
    ] {
        assert!(text.contains(exported), "{exported} in\n{text}");
    }
    let documented = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/metrics.md"
    ));
    assert!(documented
        .unwrap()
        .contains("`inflight_tls_handshake_failures_total`"));
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(WAIT, plain.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the plain client was closed");
    let started = Instant::now();
    while failures().await < before + 1.0 {
        assert!(
            started.elapsed() < WAIT,
            "the failed handshake was not counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
