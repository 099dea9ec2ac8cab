//! The proxy's upstream: `GET /work/{id}` streams a chunk every 20 ms until `POST /end/{id}` comes
//! (straight from the holder, not through the proxy), its client goes, or 30 s pass. It tells the
//! admission's token back in `X-Chaos-Token`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::holder::http::header;

/// Starts the upstream on a free port of 127.0.0.1; its port.
pub(crate) async fn start() -> std::io::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let ended: Arc<Mutex<HashSet<String>>> = Arc::default();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let ended = ended.clone();
            tokio::spawn(async move {
                let _ = serve(stream, ended).await;
            });
        }
    });
    Ok(port)
}

async fn serve(mut stream: TcpStream, ended: Arc<Mutex<HashSet<String>>>) -> std::io::Result<()> {
    let _ = stream.set_nodelay(true);
    // Requests here have no body: the head is all there is to read.
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head);
    let path = text.split(' ').nth(1).unwrap_or_default().to_owned();
    if let Some(id) = path.strip_prefix("/end/") {
        ended.lock().expect("the set").insert(id.to_owned());
        let answer = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        return stream.write_all(answer.as_bytes()).await;
    }
    let id = path.strip_prefix("/work/").unwrap_or_default().to_owned();
    // The admission's token, as the proxy forwards it (`--forward-token`), told back to the client.
    let token = header(&text, "inflight-token").unwrap_or_default();
    let head = format!(
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\
         X-Chaos-Token: {token}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if ended.lock().expect("the set").remove(&id) {
            break;
        }
        stream.write_all(b"1\r\nx\r\n").await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stream.write_all(b"0\r\n\r\n").await
}
