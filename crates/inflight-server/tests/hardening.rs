//! A hostile client against the server, on loopback: each test is a row of RELIABILITY.md.
#![allow(missing_docs)]

mod common;

use std::time::{Duration, Instant};

use common::{limits, start_api, Make, Memory};
use inflight_server::Settings;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A client that sends its headers one byte at a time, slowly, is closed after `--header-timeout`; one
/// that sends them at once is answered.
#[tokio::test]
async fn a_slow_header_sender_is_closed_after_the_header_timeout() {
    let settings = Settings {
        header_timeout: Duration::from_millis(300),
        ..limits(1, 0)
    };
    let server = start_api(&settings, Memory::stores(&None)).await;
    let address = server.url("").trim_start_matches("http://").to_owned();

    let mut prompt = tokio::net::TcpStream::connect(&address).await.unwrap();
    prompt
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    prompt.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    let mut slow = tokio::net::TcpStream::connect(&address).await.unwrap();
    let started = Instant::now();
    let request =
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let mut closed = false;
    for byte in request {
        if slow.write_all(&[*byte]).await.is_err() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Closed by the server: a read sees the end (or a reset).
        let mut buf = [0u8; 256];
        match tokio::time::timeout(Duration::from_millis(1), slow.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed = true;
                break;
            }
            Ok(Ok(n)) => {
                let text = String::from_utf8_lossy(&buf[..n]).to_string();
                assert!(
                    !text.starts_with("HTTP/1.1 200"),
                    "answered a slow sender: {text}"
                );
            }
            Err(_) => {}
        }
    }
    assert!(closed, "the slow sender was never closed");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "closed only after {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_header_timeout_out_of_range_is_refused() {
    use inflight_server::config::Layered;
    let flags = ["inflight", "--header-timeout", "1ms"];
    let err = Settings::from_flags(flags).unwrap_err();
    assert_eq!(err.setting, "header_timeout");
    let fine = Settings::from_flags(["inflight"]).unwrap();
    assert_eq!(fine.header_timeout, Duration::from_secs(10), "the default");
}
