//! The floor under the proxy: the least a forwarder built on the same parts (hyper's HTTP/1 server and
//! client, Tokio, one single-threaded runtime and `SO_REUSEPORT` socket per worker, pooled keep-alive
//! connections per worker) can do per request. No limiter, no router, no header rewriting, no metrics: the
//! request goes upstream as it came and the response comes back as it came. `scripts/bench.sh` runs it
//! beside the proxy, so the table shows how much of the proxy's cost is the limiter's and its own, and
//! how much is the HTTP stack's.
//!
//! ```text
//! cargo run --release -p inflight-server --example hyper_floor -- 127.0.0.1:8081 127.0.0.1:8080 [workers]
//! ```

use std::cell::RefCell;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::rc::Rc;

use bytes::Bytes;
use futures_util::FutureExt;
use http_body_util::{Either, Empty};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

type Pool = Rc<RefCell<Vec<SendRequest<Incoming>>>>;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: hyper_floor LISTEN UPSTREAM [WORKERS]";
    let listen: SocketAddr = args.next().ok_or_else(|| anyhow::anyhow!(usage))?.parse()?;
    let upstream: SocketAddr = args.next().ok_or_else(|| anyhow::anyhow!(usage))?.parse()?;
    let workers = match args.next() {
        Some(n) => n.parse()?,
        None => std::thread::available_parallelism().map_or(1, usize::from),
    };
    let listeners = {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let _entered = runtime.enter();
        inflight_server::server::bind(listen, workers)?
    };
    let threads: Vec<_> = listeners
        .into_iter()
        .map(|listener| std::thread::spawn(move || worker(listener, upstream)))
        .collect();
    for thread in threads {
        thread
            .join()
            .map_err(|_| anyhow::anyhow!("a worker panicked"))??;
    }
    Ok(())
}

fn worker(listener: std::net::TcpListener, upstream: SocketAddr) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let listener = TcpListener::from_std(listener)?;
        let pool: Pool = Rc::default();
        loop {
            let (stream, _) = listener.accept().await?;
            stream.set_nodelay(true)?;
            let pool = pool.clone();
            tokio::task::spawn_local(async move {
                let service = service_fn(move |request| forward(pool.clone(), upstream, request));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}

async fn forward(
    pool: Pool,
    upstream: SocketAddr,
    request: Request<Incoming>,
) -> Result<Response<Either<Incoming, Empty<Bytes>>>, Infallible> {
    let mut sender = checkout(&pool);
    if sender.is_none() {
        sender = connect(upstream).await;
    }
    let Some(mut sender) = sender else {
        return Ok(unavailable());
    };
    let response = sender.send_request(request).await;
    // Pooled now: hyper keeps it busy (not ready) until the response body has been read.
    pool.borrow_mut().push(sender);
    Ok(response.map_or_else(|_| unavailable(), |response| response.map(Either::Left)))
}

/// The most recently used connection that can take a request now.
fn checkout(pool: &Pool) -> Option<SendRequest<Incoming>> {
    let mut idle = pool.borrow_mut();
    for index in (0..idle.len()).rev() {
        match idle[index].ready().now_or_never() {
            Some(Ok(())) => return Some(idle.swap_remove(index)),
            Some(Err(_)) => drop(idle.swap_remove(index)),
            None => {}
        }
    }
    None
}

async fn connect(upstream: SocketAddr) -> Option<SendRequest<Incoming>> {
    let stream = TcpStream::connect(upstream).await.ok()?;
    stream.set_nodelay(true).ok()?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::task::spawn_local(connection);
    Some(sender)
}

fn unavailable() -> Response<Either<Incoming, Empty<Bytes>>> {
    let mut response = Response::new(Either::Right(Empty::new()));
    *response.status_mut() = hyper::StatusCode::BAD_GATEWAY;
    response
}
