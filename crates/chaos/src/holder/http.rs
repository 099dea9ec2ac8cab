//! The HTTP holder: a client of `inflight serve` (`POST /v1/permits`, `DELETE /v1/permits/{id}`), over
//! plain HTTP/1.1 on a TCP connection per request. Holds are shorter than the lease: no renewals.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{Rng, Task};

/// The answer to one request: its status (0 when no status line came), and its body as JSON (null when
/// it is not).
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: Value,
}

/// `host:port` of an `http://host:port[/...]` URL.
pub(crate) fn authority(url: &str) -> &str {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    rest.split('/').next().unwrap_or(rest)
}

/// Sends one request (`Connection: close`) and reads the answer to its end, within 10 s.
pub(crate) async fn request(
    addr: &str,
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<Answer> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(head.as_bytes()).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        let text = String::from_utf8_lossy(&raw);
        let body = text.split_once("\r\n\r\n").unwrap_or_default().1;
        let body = serde_json::from_str(body).unwrap_or(Value::Null);
        Ok::<_, std::io::Error>(Answer {
            status: status_of(&text),
            body,
        })
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
}

/// The status of an HTTP answer's head (0 when it has none).
pub(crate) fn status_of(head: &str) -> u16 {
    head.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The value of the header `name` in an HTTP head.
pub(crate) fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

/// The fencing token of an admission's answer (`None` for 0: nothing held, an unlimited key).
pub(crate) fn token_in(body: &Value) -> Option<u64> {
    body.get("token")
        .and_then(Value::as_u64)
        .filter(|&token| token > 0)
}

/// One admission, renewals while held, and a release.
pub(super) async fn cycle(task: &Task, rng: &mut Rng, n: usize) {
    let info = task.next_permit(rng, n);
    let addr = authority(&task.args.target);
    let body =
        json!({"keys": info.keys, "id": info.id, "weight": info.weight, "lease_ms": info.lease_ms});
    let history = &task.history;
    let invoke = history.now();
    let answer = request(addr, "POST", "/v1/permits", &body.to_string()).await;
    let complete = history.now();
    let (result, mut token) = match &answer {
        Ok(a) if a.status == 201 => {
            // An unlimited key is answered without a lease.
            let leased = a
                .body
                .get("lease_expires_at_ms")
                .is_some_and(|v| !v.is_null());
            let result = if leased { "admitted" } else { "unlimited" };
            (result, token_in(&a.body))
        }
        Ok(a) if a.status == 429 => ("full", None),
        _ => ("error", None),
    };
    history.permit_op("acquire", &info, (invoke, complete), result, token);
    if result != "admitted" {
        tokio::time::sleep(Duration::from_millis(5 + rng.below(20))).await;
        return;
    }
    let path = format!("/v1/permits/{}", info.id);
    // Renewed every third of the lease while held (a long hold outlives its lease otherwise).
    let hold_until = tokio::time::Instant::now() + task.hold(rng);
    let every = Duration::from_millis(info.lease_ms / 3);
    let mut lost = false;
    loop {
        let next = tokio::time::Instant::now() + every;
        if lost || next >= hold_until {
            tokio::time::sleep_until(hold_until).await;
            break;
        }
        tokio::time::sleep_until(next).await;
        let invoke = history.now();
        // Naming the admission's token: a renewal never takes over a later admission of the id.
        let renewal = json!({"lease_ms": info.lease_ms, "token": token}).to_string();
        let (result, readded) = match request(addr, "PUT", &path, &renewal).await {
            Ok(a) if a.status == 200 => {
                // A lease re-added (it had gone) comes with a new token, named from then on.
                match token_in(&a.body).filter(|&new| Some(new) != token) {
                    Some(new) => ("readded", Some(new)),
                    None => ("renewed", None),
                }
            }
            Ok(a) if a.status == 404 => ("lost", None),
            _ => ("error", None),
        };
        lost = result == "lost";
        token = readded.or(token);
        history.permit_op("renew", &info, (invoke, history.now()), result, token);
    }
    let invoke = history.now();
    // Naming the token: a late release never removes a later admission of the same id.
    let release = match token {
        Some(token) => format!("{path}?token={token}"),
        None => path.clone(),
    };
    let answer = request(addr, "DELETE", &release, "").await;
    let result = match answer {
        Ok(a) if (200..300).contains(&a.status) => "released",
        Ok(a) if a.status == 404 => "gone",
        _ => "error",
    };
    history.permit_op("release", &info, (invoke, history.now()), result, token);
}
