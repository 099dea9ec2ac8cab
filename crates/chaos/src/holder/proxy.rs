//! The proxy holder: requests through `inflight proxy` to the run's upstream, which streams until told
//! to end. A request is admitted when its answer's head arrives, and released when this holder tells the
//! upstream to end (the proxy releases only after the stream's end, so never before that) or, in a storm,
//! when it drops the connection.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::http::{authority, header, request, status_of};
use super::{keys, mix, next_id, Rng, Task};
use crate::history::PermitInfo;

/// Reads until the end of the answer's head; its status (0 when none came) and the admission's token
/// the upstream told back (`X-Chaos-Token`).
async fn read_head(stream: &mut TcpStream) -> std::io::Result<(u16, Option<u64>)> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await? == 0 {
            break;
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head);
    let token = header(&text, "x-chaos-token").and_then(|t| t.parse().ok());
    Ok((status_of(&text), token.filter(|&t| t > 0)))
}

/// One request held open, and its end.
pub(super) async fn cycle(task: &Task, rng: &mut Rng) {
    // The proxy takes one key a request, weight 1.
    let jobs: Vec<_> = mix("single").iter().filter(|j| j.1 == 1).collect();
    let job = jobs[rng.below(jobs.len() as u64) as usize];
    let info = PermitInfo {
        keys: keys(job),
        id: next_id(&task.args.process),
        weight: 1,
        lease_ms: task.args.lease_ms,
    };
    let history = &task.history;
    let invoke = history.now();
    let opened = async {
        let mut stream = TcpStream::connect(authority(&task.args.target)).await?;
        let head = format!(
            "GET /work/{} HTTP/1.1\r\nHost: chaos\r\nX-Inflight-Key: {}\r\nConnection: close\r\n\r\n",
            info.id, info.keys[0]
        );
        stream.write_all(head.as_bytes()).await?;
        let status = read_head(&mut stream).await?;
        Ok::<_, std::io::Error>((stream, status))
    };
    let opened = tokio::time::timeout(Duration::from_secs(10), opened).await;
    let complete = history.now();
    let (mut stream, (status, token)) = match opened {
        Ok(Ok(opened)) => opened,
        _ => {
            history.permit_op("acquire", &info, (invoke, complete), "error", None);
            return;
        }
    };
    let result = match status {
        200 => "admitted",
        429 => "full",
        _ => "error",
    };
    history.permit_op("acquire", &info, (invoke, complete), result, token);
    if status != 200 {
        tokio::time::sleep(Duration::from_millis(5 + rng.below(20))).await;
        return;
    }
    tokio::time::sleep(task.hold(rng)).await;
    let invoke = history.now();
    if task.args.storm {
        // Gone without a word: a reset, so the proxy sees it at once.
        // Linger 0 closes at once with a reset: the drop never blocks.
        #[allow(deprecated)]
        let _ = stream.set_linger(Some(Duration::ZERO));
        drop(stream);
        history.permit_op("release", &info, (invoke, history.now()), "released", token);
        return;
    }
    let upstream = task.args.upstream.as_deref().unwrap_or_default();
    let ended = request(upstream, "POST", &format!("/end/{}", info.id), "").await;
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest)).await;
    let result = match (ended, read) {
        (Ok(a), Ok(Ok(_))) if a.status == 200 => "released",
        _ => "error",
    };
    // The proxy releases the lease of the token it forwarded.
    history.permit_op("release", &info, (invoke, history.now()), result, token);
}
