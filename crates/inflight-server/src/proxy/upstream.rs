//! Connections to the upstream: HTTP/1.1 keep-alive connections, pooled per worker (each worker builds
//! its own router, so its pool is used by one thread only). A connection goes back to the pool when its
//! response body has been read to the end; one whose response ended any other way is closed, since the
//! rest of that response would still be on it. (hyper itself never sends a request on a connection whose
//! previous exchange is unfinished either way: such a connection hands the request back, and it goes on a
//! new one.) Connections are made by hyper-util's `HttpConnector`: every address a name resolves to is
//! tried, IPv6 and IPv4 raced as RFC 8305 says.
//!
//! Each connection keeps its own timer for the wait for response headers, moved to each new request's
//! deadline. Moving a timer that has not fired yet to a later deadline is one atomic operation, where a
//! timer of each request's own would be added to and taken off the runtime's timer wheel under its lock
//! (and wake the runtime's driver through its eventfd a fifth of the time): about 500 instructions per
//! request (`scripts/instructions.sh`) and a fifth of a system call (`perf stat -e
//! 'syscalls:sys_enter_*'` during a `wrk` run). A timer left behind by a request wakes
//! that request's task once if it fires later (a wake that finds nothing to do), and keeps the task's
//! memory until then or until the connection is used again: at most one task per pooled connection.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::time::Sleep;
use tower_service::Service;

/// Idle connections kept, at most (nginx's `keepalive 128`).
const MAX_IDLE: usize = 128;

/// An idle connection older than this is closed instead of used (when the pool is next used: a pool that
/// is never used again keeps its connections until the upstream closes them).
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why no response came from the upstream.
#[derive(Debug, thiserror::Error)]
pub(super) enum UpstreamError {
    /// No response headers by the deadline.
    #[error("the upstream did not answer in time")]
    Timeout,
    /// No connection within the connect timeout (name lookup included).
    #[error("connecting to the upstream timed out")]
    ConnectTimeout,
    /// The connection could not be made: the error and its causes.
    #[error("connecting to the upstream failed: {0}")]
    Connect(String),
    /// The exchange failed.
    #[error(transparent)]
    Http(#[from] hyper::Error),
}

/// The upstream's address and this worker's idle connections to it.
pub(super) struct Connections {
    /// `http://host:port`.
    address: http::Uri,
    connector: HttpConnector,
    connect_timeout: Duration,
    /// Most recently used last.
    idle: Mutex<VecDeque<Idle>>,
}

/// A connection to the upstream, and its timer for the wait for response headers.
struct Connection {
    sender: SendRequest<Incoming>,
    timer: Pin<Box<Sleep>>,
}

struct Idle {
    connection: Connection,
    since: Instant,
}

/// The connection a response came on, to give back once its body has been read to the end.
pub(super) struct Reusable {
    connection: Connection,
    pool: Arc<Connections>,
}

impl Reusable {
    /// Returns the connection to the pool.
    pub(super) fn give_back(self) {
        self.pool.park(self.connection);
    }
}

impl Connections {
    /// Connections to `address` (`http://host:port`).
    pub(super) fn new(address: http::Uri, connect_timeout: Duration) -> Arc<Self> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(connect_timeout));
        Arc::new(Self {
            address,
            connector,
            connect_timeout,
            idle: Mutex::new(VecDeque::new()),
        })
    }

    /// Sends `request` (origin-form, with its Host header) on an idle connection, else on a new one, and
    /// waits for the response headers until `deadline` (connecting included). A request that its
    /// connection closed before sending it goes once more, on a new connection.
    pub(super) async fn send(
        self: &Arc<Self>,
        request: Request<Incoming>,
        deadline: tokio::time::Instant,
    ) -> Result<(Response<Incoming>, Reusable), UpstreamError> {
        // Connecting is rare: boxed, its future does not weigh on every request's.
        let mut connection = match self.checkout() {
            Some(connection) => connection,
            None => Box::pin(self.connect(deadline)).await?,
        };
        connection.timer.as_mut().reset(deadline);
        let sent = connection.sender.try_send_request(request);
        let response = match within(&mut connection.timer, sent).await? {
            Ok(response) => response,
            Err(mut error) => match error.take_message() {
                Some(request) => {
                    connection = Box::pin(self.connect(deadline)).await?;
                    let sent = connection.sender.send_request(request);
                    within(&mut connection.timer, sent).await??
                }
                None => return Err(error.into_error().into()),
            },
        };
        let reusable = Reusable {
            connection,
            pool: self.clone(),
        };
        Ok((response, reusable))
    }

    /// The most recently used idle connection that can take a request now, if any. One still busy (say,
    /// still sending a request body its upstream answered early) goes to the far end, to be tried last.
    fn checkout(&self) -> Option<Connection> {
        let mut idle = self.lock();
        for _ in 0..idle.len() {
            let Idle {
                mut connection,
                since,
            } = idle.pop_back()?;
            if since.elapsed() > IDLE_TIMEOUT {
                // The rest have waited longer still.
                idle.clear();
                return None;
            }
            match connection.sender.ready().now_or_never() {
                Some(Ok(())) => return Some(connection),
                Some(Err(_)) => {} // closed
                None => idle.push_front(Idle { connection, since }),
            }
        }
        None
    }

    /// Keeps a connection for later. Idle ones past the idle timeout are closed, and the oldest one when the
    /// pool is full.
    fn park(&self, connection: Connection) {
        if connection.sender.is_closed() {
            return;
        }
        let mut idle = self.lock();
        while idle
            .front()
            .is_some_and(|oldest| oldest.since.elapsed() > IDLE_TIMEOUT)
        {
            idle.pop_front();
        }
        if idle.len() >= MAX_IDLE {
            idle.pop_front();
        }
        idle.push_back(Idle {
            connection,
            since: Instant::now(),
        });
    }

    /// A new connection, made by `deadline` and within the connect timeout.
    async fn connect(&self, deadline: tokio::time::Instant) -> Result<Connection, UpstreamError> {
        let mut timer = Box::pin(tokio::time::sleep_until(deadline));
        let connecting = self.connector.clone().call(self.address.clone());
        let io = within(
            &mut timer,
            tokio::time::timeout(self.connect_timeout, connecting),
        )
        .await?
        .map_err(|_| UpstreamError::ConnectTimeout)?
        // "tcp connect error: Connection refused (os error 111)": the message and its causes.
        .map_err(|error| UpstreamError::Connect(format!("{:#}", anyhow::Error::new(error))))?;
        let (sender, connection) = within(&mut timer, http1::handshake(io)).await??;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "upstream connection ended");
            }
        });
        Ok(Connection { sender, timer })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Idle>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `work`'s output, unless `timer` fires first.
async fn within<F: Future>(
    timer: &mut Pin<Box<Sleep>>,
    work: F,
) -> Result<F::Output, UpstreamError> {
    let mut work = std::pin::pin!(work);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(output) = work.as_mut().poll(cx) {
            return Poll::Ready(Ok(output));
        }
        timer
            .as_mut()
            .poll(cx)
            .map(|()| Err(UpstreamError::Timeout))
    })
    .await
}
