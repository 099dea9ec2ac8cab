//! An upstream API to proxy to: echoes, event streams (one gated, one endless), an endless flood of
//! bytes, delays, errors; it counts the requests and the connections it has seen, and the endless
//! streams that ended.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::routing::{any, get};
use axum::serve::ListenerExt;
use axum::Router;
use http::StatusCode;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// An upstream API to proxy to.
pub struct Upstream {
    pub base: String,
    /// Requests it has seen.
    pub hits: Arc<AtomicUsize>,
    /// Each permit lets `/sse` send its next event.
    pub gate: Arc<Semaphore>,
    /// Connections it has accepted.
    pub connections: Arc<AtomicUsize>,
    /// `/forever` streams that ended: dropped once their client (the proxy) went away.
    pub ended: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

/// Counts one in its counter when dropped.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    pub async fn start() -> Self {
        let hits = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(Semaphore::new(0));
        let (h1, h2, h3, h4, g) = (
            hits.clone(),
            hits.clone(),
            hits.clone(),
            hits.clone(),
            gate.clone(),
        );
        let ended = Arc::new(AtomicUsize::new(0));
        let e = ended.clone();
        let app = Router::new()
            .route(
                "/echo/{*rest}",
                any(move |request: Request| {
                    let hits = h1.clone();
                    async move {
                        hits.fetch_add(1, Ordering::SeqCst);
                        echo(request).await
                    }
                }),
            )
            .route(
                "/sse",
                get(move || {
                    let (hits, gate) = (h2.clone(), g.clone());
                    async move {
                        hits.fetch_add(1, Ordering::SeqCst);
                        let events = futures_util::stream::unfold(0u32, move |n| {
                            let gate = gate.clone();
                            async move {
                                if n == 3 {
                                    return None;
                                }
                                if n > 0 {
                                    gate.acquire().await.expect("gate").forget();
                                }
                                Some((
                                    Ok::<_, Infallible>(Bytes::from(format!("data: {n}\n\n"))),
                                    n + 1,
                                ))
                            }
                        });
                        (
                            [("content-type", "text/event-stream")],
                            Body::from_stream(events),
                        )
                    }
                }),
            )
            .route(
                "/forever",
                get(move || {
                    let ended = Counted(e.clone());
                    async move {
                        let ticks = futures_util::stream::unfold(ended, |ended| async {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            Some((
                                Ok::<_, Infallible>(Bytes::from_static(b"data: tick\n\n")),
                                ended,
                            ))
                        });
                        (
                            [("content-type", "text/event-stream")],
                            Body::from_stream(ticks),
                        )
                    }
                }),
            )
            .route(
                "/flood",
                get(|| async {
                    let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
                    let chunks = futures_util::stream::repeat_with(move || {
                        Ok::<_, Infallible>(chunk.clone())
                    });
                    Body::from_stream(chunks)
                }),
            )
            .route("/empty", get(|| async { StatusCode::NO_CONTENT }))
            .route(
                "/delay/{ms}",
                get(
                    |axum::extract::Path(ms): axum::extract::Path<u64>| async move {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        "late, but answered"
                    },
                ),
            )
            .route(
                "/close",
                get(|| async { ([("connection", "close")], "closing") }),
            )
            .route(
                "/slow",
                get(move || {
                    let hits = h3.clone();
                    async move {
                        hits.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_secs(30)).await;
                        "late"
                    }
                }),
            )
            .fallback(move || {
                let hits = h4.clone();
                async move {
                    hits.fetch_add(1, Ordering::SeqCst);
                    (StatusCode::NOT_FOUND, "no such route upstream")
                }
            });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let connections = Arc::new(AtomicUsize::new(0));
        let accepted = connections.clone();
        let listener = listener.tap_io(move |_| {
            accepted.fetch_add(1, Ordering::SeqCst);
        });
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            base,
            hits,
            gate,
            connections,
            ended,
            task,
        }
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// `/forever` streams that ended.
    pub fn ended(&self) -> usize {
        self.ended.load(Ordering::SeqCst)
    }
}

async fn echo(request: Request) -> axum::Json<serde_json::Value> {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    let headers: serde_json::Map<String, serde_json::Value> = parts
        .headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("?").into()))
        .collect();
    axum::Json(serde_json::json!({
        "method": parts.method.as_str(),
        "path": parts.uri.path(),
        "query": parts.uri.query(),
        "headers": headers,
        "body": String::from_utf8_lossy(&body),
    }))
}

/// An upstream that refuses every connection: a port bound but not listening, kept for as long as the
/// value lives, so that no other test's server can be given the port meanwhile (a port bound, then
/// let go, can be).
pub struct Refusing {
    _socket: tokio::net::TcpSocket,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
}

impl Refusing {
    pub fn new() -> Self {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let base = format!("http://{}", socket.local_addr().unwrap());
        Self {
            _socket: socket,
            base,
        }
    }
}
