//! Serving one listener: accepting under the connection cap, and each connection with its bounds (its
//! deadlines, its request bodies' timeout, HTTP/2's limits) and hyper's refusals in JSON; with TLS,
//! after its handshake (within `--header-timeout`, its place under the cap held meanwhile).

use std::sync::Arc;
use std::time::Duration;

use axum::serve::Listener;
use futures_util::FutureExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::exchange::{Exchanges, ResponseBody};
use super::gate::{Gate, Slot, RESERVE_HEAD_TIMEOUT};
use super::guarded::Guarded;
use super::routes::Routes;
use super::tls::Tls;
use super::{Bounds, CUT_WAIT};
use crate::incoming::{BodyLimits, RequestBody};
use crate::proxy::Peer;

/// A worker's listener: axum's accepting (which rides out errors such as too many open files), without
/// Nagle's delay.
pub(super) struct NoDelay(pub(super) TcpListener);

impl Listener for NoDelay {
    type Io = tokio::net::TcpStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (io, addr) = Listener::accept(&mut self.0).await;
        let _ = io.set_nodelay(true);
        (io, addr)
    }

    fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.0.local_addr()
    }
}

/// What one listener serves, and under which cap.
pub(super) struct Served {
    pub(super) listener: NoDelay,
    pub(super) routes: Routes,
    /// What a connection in the gate's reserve is answered (health checks only).
    pub(super) health: Routes,
    pub(super) gate: Gate,
    pub(super) tls: Option<Tls>,
}

/// hyper's connection settings: HTTP/1.1, or HTTP/2 with prior knowledge, with the HTTP/2 limits; with
/// `keep_alive` off an HTTP/1 connection closes after one answer. Deadlines are the [`Exchanges`]'s.
fn builder(bounds: &Bounds, keep_alive: bool) -> auto::Builder<TokioExecutor> {
    let limits = &bounds.connections;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .keep_alive(keep_alive);
    let interval = limits.http2_keep_alive_interval;
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.http2_max_concurrent_streams)
        .initial_stream_window_size(limits.http2_stream_window)
        .initial_connection_window_size(limits.http2_connection_window)
        .max_header_list_size(limits.http2_max_header_list_size)
        .keep_alive_interval((!interval.is_zero()).then_some(interval))
        .keep_alive_timeout(HTTP2_PING_TIMEOUT);
    builder
}

/// How long an HTTP/2 client may take to answer the server's ping.
const HTTP2_PING_TIMEOUT: Duration = Duration::from_secs(20);

/// One accepted connection, with what serving it takes.
struct Connection {
    routes: Routes,
    builder: Arc<auto::Builder<TokioExecutor>>,
    client: Peer,
    limits: crate::config::Connections,
    /// Ends the connection gracefully at shutdown; taken before a TLS handshake, so that shutdown waits
    /// for the handshake (bounded) too.
    watcher: Watcher,
    /// Its place under the cap, held until it closes.
    slot: Slot,
    /// Whether it is TLS: its requests then carry [`Scheme::HTTPS`](http::uri::Scheme::HTTPS) in their
    /// extensions (the proxy's X-Forwarded-Proto).
    tls: bool,
}

impl Connection {
    /// Serves its requests (over `io`, the TCP stream or the TLS stream over it) until it closes.
    async fn serve<I>(self, io: I)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let limits = &self.limits;
        let exchanges = Exchanges::new(limits.header_timeout, limits.idle_timeout);
        let io = TokioIo::new(Guarded::new(io, exchanges.clone(), limits.send_timeout));
        let body_limits = BodyLimits {
            timeout: limits.body_timeout,
            min_rate: limits.body_min_rate,
        };
        let service = hyper::service::service_fn(move |mut request: http::Request<Incoming>| {
            let ongoing = exchanges.begin(request.version());
            if self.tls {
                request.extensions_mut().insert(http::uri::Scheme::HTTPS);
            }
            let request = request.map(|body| RequestBody::new(body, body_limits));
            self.routes
                .respond(request, &self.client)
                .map(move |answered| {
                    answered.map(|response| response.map(|body| ResponseBody::new(body, ongoing)))
                })
        });
        let connection = self
            .builder
            .serve_connection_with_upgrades(io, service)
            .into_owned();
        let _ = self.watcher.watch(connection).await;
        drop(self.slot);
    }
}

/// Serves the connections the listener accepts until told to stop; then closes each once its current
/// exchange is over, and returns when all have closed, cutting responses still running after the grace.
pub(super) async fn serve(
    served: Served,
    mut stopping: watch::Receiver<bool>,
    bounds: &Bounds,
    cut: &watch::Sender<bool>,
) {
    let Served {
        mut listener,
        routes,
        health,
        gate,
        tls,
    } = served;
    let connections = GracefulShutdown::new();
    if tls.is_some() {
        // Exported from the start, so that a rate over them is defined before the first failure.
        handshake_failure(true).increment(0);
        handshake_failure(false).increment(0);
    }
    let (open, reserve) = (builder(bounds, true), builder(bounds, false));
    let (open, reserve) = (Arc::new(open), Arc::new(reserve));
    let limits = &bounds.connections;
    loop {
        let (io, addr) = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopping.wait_for(|stop| *stop) => break,
        };
        // At the cap this connection waits for a place, and meanwhile this worker accepts no other: they
        // wait in the listen queue. (Waiting before accepting instead could leave a place held by a
        // worker whose own queue is empty while another's waits.)
        let slot = tokio::select! {
            slot = gate.enter() => slot,
            _ = stopping.wait_for(|stop| *stop) => break,
        };
        let mut limits = limits.clone();
        let (routes, builder) = match slot.reserve {
            false => (routes.clone(), open.clone()),
            true => {
                limits.header_timeout = limits.header_timeout.min(RESERVE_HEAD_TIMEOUT);
                (health.clone(), reserve.clone())
            }
        };
        let connection = Connection {
            routes,
            builder,
            client: Peer::new(addr),
            limits,
            watcher: connections.watcher(),
            slot,
            tls: tls.is_some(),
        };
        match &tls {
            None => drop(tokio::spawn(connection.serve(io))),
            Some(tls) => {
                let tls = tls.clone();
                tokio::spawn(async move {
                    // A failed handshake (or none within the bound) closes the connection: the client
                    // sees the TLS alert, or the connection closed.
                    match tls.accept(io, connection.limits.header_timeout).await {
                        Ok(io) => connection.serve(io).await,
                        Err(error) => {
                            handshake_failure(error.kind() == std::io::ErrorKind::TimedOut)
                                .increment(1);
                            tracing::debug!(%error, "TLS handshake failed");
                        }
                    }
                });
            }
        }
    }
    drop(listener);
    let grace = bounds.grace;
    let mut closed = std::pin::pin!(connections.shutdown());
    if tokio::time::timeout(grace, &mut closed).await.is_err() {
        tracing::warn!(
            ?grace,
            "grace period over: ending the responses still running"
        );
        cut.send_replace(true);
        let _ = tokio::time::timeout(CUT_WAIT, closed).await;
    }
}

/// Connections closed in their TLS handshake: not done within the bound (`timed_out`), or failed.
fn handshake_failure(timed_out: bool) -> metrics::Counter {
    let reason = if timed_out { "timeout" } else { "error" };
    metrics::counter!("inflight_tls_handshake_failures_total", "reason" => reason)
}
