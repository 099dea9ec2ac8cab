//! The running process: secrets kept out of its log, a log it cannot write, SIGTERM, and its
//! workers on one address.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::process::{listen_of, Running};
use crate::{serve, start};

#[test]
fn secrets_never_reach_the_log() {
    let line = serve(
        &[
            "--store",
            "redis://:hunter2@127.0.0.1:1/0",
            "--admin-token",
            "tok3n",
        ],
        &[],
    )
    .unwrap();
    assert!(
        !line.contains("hunter2") && !line.contains("tok3n"),
        "{line}"
    );
    assert!(line.contains("***@127.0.0.1:1/0"), "{line}");
}

#[test]
fn sigterm_stops_the_server_gracefully() {
    let (mut server, _) = Running::start(&["serve", "--listen", "127.0.0.1:0"]);
    server.signal("-TERM");
    let exit = server.wait_for(Duration::from_secs(5));
    assert!(exit.success(), "{exit:?}");
    let rest = server.rest_of_log();
    assert!(rest.iter().any(|l| l.contains("shutting down")), "{rest:?}");
}

#[test]
fn workers_share_one_address_that_no_other_server_can_take() {
    let line = serve(&["--workers", "3"], &[]).unwrap();
    assert!(line.contains("workers=3"), "{line}");
    let (_first, started) = Running::start(&["serve", "--listen", "127.0.0.1:0", "--workers", "2"]);
    let listen = listen_of(&started);
    // The first server's sockets share their port with each other, not with a server started after it.
    let err = start(&["serve", "--listen", &listen, "--workers", "2"], &[])
        .expect_err("a second server on a taken address");
    assert!(err.contains("cannot listen on"), "{err}");
}

#[cfg(target_os = "linux")]
#[test]
fn a_log_that_cannot_be_written_does_not_stop_the_server() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let mut server = Running::spawn(
        Command::new(env!("CARGO_BIN_EXE_inflight"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--default-limit", "7919"]) // tells its answers from another test's server's
            .env_clear()
            .stderr(Stdio::from(full)),
    );
    let started = Instant::now();
    // The port was free a moment ago; until this server answers on it, another test's may have it.
    let answered = loop {
        use std::io::{Read, Write};
        let mut answer = String::new();
        if let Ok(mut tcp) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            tcp.write_all(b"GET /v1/keys/k HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .unwrap();
            let _ = tcp.read_to_string(&mut answer);
        }
        if answer.contains("7919") {
            break answer;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the server never answered: {answer}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
    assert!(server.is_running(), "the server died writing its log");
    server.signal("-TERM");
    let exit = server.wait_for(Duration::from_secs(10));
    assert!(exit.success(), "{exit:?}");
}
