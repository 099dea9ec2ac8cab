//! The proxy holder: requests through `inflight proxy` to the run's upstream, which streams until told
//! to end. A request is admitted when its answer's head arrives, and released when this holder tells the
//! upstream to end (the proxy releases only after the stream's end, so never before that) or, in a storm,
//! when it drops the connection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::http::{authority, request};
use super::{mix, next_id, Rng, Task};
use crate::history::PermitInfo;

pub(super) async fn run(task: Arc<Task>) -> crate::Result {
    let mut tasks = Vec::new();
    for n in 0..task.args.tasks {
        let task = task.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(task.args.seed.wrapping_mul(7919) + n as u64);
            while Instant::now() < task.until {
                cycle(&task, &mut rng).await;
            }
        }));
    }
    for handle in tasks {
        handle.await?;
    }
    Ok(())
}

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
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let token = text.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        let token = value.trim().parse().ok()?;
        name.eq_ignore_ascii_case("x-chaos-token").then_some(token)
    });
    Ok((status, token.filter(|&t| t > 0)))
}

async fn cycle(task: &Task, rng: &mut Rng) {
    // The proxy takes one key a request, weight 1.
    let jobs: Vec<_> = mix("single")
        .into_iter()
        .filter(|j| j.weight == 1)
        .collect();
    let job = &jobs[rng.below(jobs.len() as u64) as usize];
    let info = PermitInfo {
        keys: job.keys.clone(),
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
