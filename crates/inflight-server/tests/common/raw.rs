//! A client on a raw socket: requests written byte for byte, answers read as they come, each wait bounded.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The longest any read here waits.
const WAIT: Duration = Duration::from_secs(5);

/// A connection to `base` (`http://host:port`).
pub async fn connect(base: &str) -> TcpStream {
    TcpStream::connect(base.trim_start_matches("http://"))
        .await
        .expect("connect")
}

/// Writes `bytes`.
pub async fn send(stream: &mut TcpStream, bytes: &[u8]) {
    stream.write_all(bytes).await.expect("write");
}

/// One answer: its head (status line and headers) and its body (by Content-Length, else to the end).
pub async fn answer(stream: &mut TcpStream) -> (String, String) {
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 8192];
    let read = async {
        loop {
            if let Some(end) = find(&bytes, b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&bytes[..end]).to_string();
                let length = head.lines().find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                });
                let body_at = end + 4;
                if length.is_some_and(|length| bytes.len() >= body_at + length) {
                    let body = &bytes[body_at..body_at + length.unwrap_or_default()];
                    return (head, String::from_utf8_lossy(body).to_string());
                }
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => {
                    let text = String::from_utf8_lossy(&bytes).to_string();
                    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
                    return (head.to_owned(), body.to_owned());
                }
                Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(WAIT, read)
        .await
        .expect("an answer within 5 s")
}

/// Every answer until the server closes the connection, in order (each body by Content-Length, the last
/// one's else to the end). Unlike repeated [`answer`] calls, answers that arrive in one read are kept.
pub async fn answers_to_the_end(stream: &mut TcpStream) -> Vec<(String, String)> {
    let mut bytes = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut bytes))
        .await
        .expect("the connection closed within 5 s")
        .expect("read");
    let mut answers = Vec::new();
    let mut rest = &bytes[..];
    while let Some(end) = find(rest, b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&rest[..end]).to_string();
        let length = head.lines().find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        });
        let body = &rest[end + 4..];
        let length = length.unwrap_or(body.len()).min(body.len());
        answers.push((head, String::from_utf8_lossy(&body[..length]).to_string()));
        rest = &body[length..];
    }
    answers
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// True when the server closes `stream` within `limit` (whatever it sends first is read and dropped).
pub async fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
    let mut chunk = [0u8; 8192];
    let closed = async {
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(limit, closed).await.is_ok()
}

/// The JSON body of an answer.
pub fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body:?}"))
}
