//! Running a server: the API or the proxy on its workers until shutdown, then a bounded grace period.
//!
//! Each worker is a thread with its own single-threaded Tokio runtime and its own listening socket on the
//! shared address (`SO_REUSEPORT`, so the kernel spreads connections over them), as nginx's worker
//! processes do: a connection, its requests and its upstream connections stay on one thread. The limiter
//! and its store are shared by every worker. With Redis, each worker batches its own admissions and
//! releases over a Redis connection of its own, so those never leave its thread either; the rest of the
//! store's work (renewals, retried releases, status reads, limit changes) runs on the runtime that built
//! the store. A client that sends everything over one connection (HTTP/2,
//! or a load balancer keeping few connections open) is served by one worker.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use axum::serve::Listener;
use axum::Router;
use futures_util::future::Either;
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use inflight::Store;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{oneshot, watch};
use tower_service::Service;

use crate::app::App;
use crate::graceful;
use crate::proxy::Proxy;

/// The client at the other end of a connection, as the proxy sees it: its address, and its IP address
/// already written out, once per connection rather than for every request that needs it (the proxy's
/// `X-Forwarded-For`; formatting an address costs more than the rest of that header's work).
#[derive(Clone, Debug)]
pub struct Peer {
    /// The client's address.
    pub addr: SocketAddr,
    /// The client's IP address, as text.
    pub ip: http::HeaderValue,
}

impl Peer {
    /// The peer at `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        let ip = http::HeaderValue::from_maybe_shared(bytes::Bytes::from(addr.ip().to_string()))
            .expect("an IP address is a valid header value");
        Self { addr, ip }
    }
}

/// What a worker answers with: the API's routes, and when it is a proxy, everything outside `/_inflight`
/// forwarded. Proxied requests go straight to the proxy, past axum's router (its routing, its request
/// extensions and its boxed handler futures cost a proxied request a tenth of its instructions:
/// `scripts/instructions.sh`).
pub struct Routes<S: Store> {
    api: Router,
    proxy: Option<Arc<Proxy<S>>>,
}

impl<S: Store> Clone for Routes<S> {
    fn clone(&self) -> Self {
        Self {
            api: self.api.clone(),
            proxy: self.proxy.clone(),
        }
    }
}

impl<S: Store> Routes<S> {
    /// The API alone, at the root.
    pub fn api(router: Router) -> Self {
        Self {
            api: router,
            proxy: None,
        }
    }

    /// A proxy: the API under `/_inflight`, everything else forwarded.
    pub(crate) fn proxy(api: Router, proxy: Arc<Proxy<S>>) -> Self {
        Self {
            api: Router::new().nest_service(API_PREFIX, api),
            proxy: Some(proxy),
        }
    }

    fn respond(
        &self,
        request: http::Request<Incoming>,
        client: &Peer,
    ) -> impl Future<Output = Result<Response, Infallible>> + Send + 'static {
        match &self.proxy {
            Some(proxy) if !is_api(request.uri().path()) => {
                Either::Left(proxy.clone().forward(request, client.clone()).map(Ok))
            }
            _ => Either::Right(self.api.clone().call(request)),
        }
    }
}

impl<S: Store> From<Router> for Routes<S> {
    fn from(router: Router) -> Self {
        Self::api(router)
    }
}

/// Where a proxy answers with its API (as `Router::nest_service` matches it: the prefix itself, or the
/// prefix and a `/`).
const API_PREFIX: &str = "/_inflight";

fn is_api(path: &str) -> bool {
    path.strip_prefix(API_PREFIX)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// A worker's listener: axum's accepting (which rides out errors such as too many open files), and no
/// Nagle delay on the accepted connections, since answers are small and latency matters.
struct NoDelay(TcpListener);

impl Listener for NoDelay {
    type Io = tokio::net::TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (io, addr) = Listener::accept(&mut self.0).await;
        let _ = io.set_nodelay(true);
        (io, addr)
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

/// How long, after the grace period, the cut streams get to close before the server stops waiting.
const CUT_WAIT: Duration = Duration::from_secs(1);

/// Listening sockets for `workers` workers on `addr` (port 0 picks one port for all of them). Call it
/// inside a Tokio runtime. Fails, like a plain bind, when anything already listens on `addr`, even
/// another process's `SO_REUSEPORT` sockets. As with nginx's `reuseport`, a process of the same user that
/// binds the address with `SO_REUSEPORT` later (or at the very same moment) shares it.
pub fn bind(addr: SocketAddr, workers: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    let socket = || {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()
        } else {
            TcpSocket::new_v6()
        }?;
        socket.set_reuseaddr(true)?;
        Ok::<_, std::io::Error>(socket)
    };
    // First a socket without SO_REUSEPORT: its bind fails if the address is taken, and fixes the port.
    let first = socket()?;
    first.bind(addr)?;
    if workers <= 1 {
        return Ok(vec![first.listen(1024)?.into_std()?]);
    }
    let addr = first.local_addr()?;
    drop(first);
    (0..workers)
        .map(|_| {
            let socket = socket()?;
            socket.set_reuseport(true)?;
            socket.bind(addr)?;
            socket.listen(1024)?.into_std()
        })
        .collect()
}

/// Serves on `listeners`, one worker thread each, with routes from `routes` each, until `shutdown`
/// completes; then stops accepting, lets running responses (proxied streams) finish for up to `grace`,
/// ends the ones still running, and releases every permit the limiter still holds. Dropping the returned
/// future stops the workers at once.
pub async fn run<S: Store>(
    listeners: Vec<std::net::TcpListener>,
    routes: impl Fn() -> Routes<S>,
    app: Arc<App<S>>,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) -> std::io::Result<()> {
    if listeners.is_empty() {
        return Err(std::io::Error::other("no listener to serve on"));
    }
    // `stop`: stop accepting and finish what runs. `end`: end at once (dropping this future does too).
    let (stop, stopping) = watch::channel(false);
    let (end, ending) = watch::channel(false);
    let mut workers = FuturesUnordered::new();
    for (n, listener) in listeners.into_iter().enumerate() {
        let (done, finished) = oneshot::channel();
        let (routes, stopping, ending) = (routes(), stopping.clone(), ending.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("inflight-worker-{n}"))
            .spawn(move || {
                let _ = done.send(worker(listener, routes, stopping, ending));
            });
        workers.push(async move {
            spawned?;
            finished
                .await
                .unwrap_or_else(|_| Err(std::io::Error::other("a worker thread panicked")))
        });
    }
    // Every worker's end, waited for; the first to fail ends the others at once.
    let served = async {
        let mut first_error = None;
        while let Some(result) = workers.next().await {
            if let Err(error) = result {
                end.send_replace(true);
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    };
    tokio::pin!(served);
    let result = tokio::select! {
        result = &mut served => result,
        () = shutdown => {
            stop.send_replace(true);
            match tokio::time::timeout(grace, &mut served).await {
                Ok(result) => result,
                Err(_) => {
                    tracing::warn!(?grace, "grace period over: ending the responses still running");
                    app.cut.send_replace(true);
                    match tokio::time::timeout(CUT_WAIT, &mut served).await {
                        Ok(result) => result,
                        Err(_) => {
                            end.send_replace(true);
                            served.await
                        }
                    }
                }
            }
        }
    };
    // The workers have all ended: what they held was dropped with their runtimes, and is being released in
    // the background; `release_held` releases the rest and waits for those.
    app.limiter.release_held().await;
    result
}

/// One worker: serves `listener` on a runtime of its own until told to stop (and its connections have
/// closed) or to end. Its runtime, with any connection still open, is gone when this returns.
fn worker<S: Store>(
    listener: std::net::TcpListener,
    routes: Routes<S>,
    stopping: watch::Receiver<bool>,
    mut ending: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let served = runtime.block_on(async move {
        let listener = NoDelay(TcpListener::from_std(listener)?);
        tokio::select! {
            () = serve(listener, routes, stopping) => Ok(()),
            _ = ending.wait_for(|end| *end) => Ok(()),
        }
    });
    // Connections still open are dropped with the runtime; a blocking task (a DNS lookup of the upstream)
    // is not waited for past this.
    runtime.shutdown_timeout(CUT_WAIT);
    served
}

/// Serves the connections `listener` accepts (HTTP/1.1, or HTTP/2 with prior knowledge) until told to stop,
/// then closes each once its current exchange is over and returns when all have closed.
async fn serve<S: Store>(
    mut listener: NoDelay,
    routes: Routes<S>,
    mut stopping: watch::Receiver<bool>,
) {
    let connections = graceful::Connections::new(stopping.clone());
    let builder = auto::Builder::new(TokioExecutor::new());
    loop {
        let (io, addr) = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopping.wait_for(|stop| *stop) => break,
        };
        let (routes, client) = (routes.clone(), Peer::new(addr));
        let service = hyper::service::service_fn(move |request| routes.respond(request, &client));
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(io), service)
            .into_owned();
        // Spawned as a task of its own, as `Watched` needs (one task's waker, the same on every poll).
        tokio::spawn(connections.watch(connection));
    }
    drop(listener);
    connections.all_closed().await;
}

/// Completes on Ctrl-C or SIGTERM. The handlers are installed when this is called (not when first
/// polled), so a signal that arrives right after start-up is not missed.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let signals = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::terminate()).ok(),
            signal(SignalKind::interrupt()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        {
            let (mut term, mut int) = signals;
            let term = async {
                match term.as_mut() {
                    Some(term) => {
                        term.recv().await;
                    }
                    None => std::future::pending().await,
                }
            };
            let int = async {
                match int.as_mut() {
                    Some(int) => {
                        int.recv().await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = term => {}
                () = int => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        tracing::info!("shutting down");
    }
}

#[cfg(test)]
mod tests {
    use super::is_api;

    #[test]
    fn the_api_prefix_is_a_whole_path_segment() {
        for path in ["/_inflight", "/_inflight/", "/_inflight/v1/keys/k"] {
            assert!(is_api(path), "{path}");
        }
        for path in [
            "/",
            "/_inflightx",
            "/_inflight_v1",
            "/v1/_inflight",
            "/_INFLIGHT/metrics",
        ] {
            assert!(!is_api(path), "{path}");
        }
    }
}
