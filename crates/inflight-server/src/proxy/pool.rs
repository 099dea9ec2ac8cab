//! This worker's connections to the upstream: HTTP/1.1 keep-alive, made by hyper-util's `HttpConnector`
//! (every address a name has is tried, IPv6 and IPv4 raced as RFC 8305 says). A connection goes back to
//! the pool as soon as its response headers are in: hyper keeps it busy until that response's body has
//! been read to the end, and closes it if the body ends any other way, so a checkout takes only one that
//! can take a request now.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use http::{Request, Response, Uri};
use hyper::body::Incoming;

use crate::incoming::RequestBody;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::client::legacy::connect::HttpConnector;
use tower_service::Service;

/// Connections kept, at most (nginx's `keepalive 128`).
const MAX_IDLE: usize = 128;

/// A connection parked longer ago than this is closed instead of used.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why no response came from the upstream.
#[derive(Debug, thiserror::Error)]
pub(super) enum UpstreamError {
    /// The connection could not be made: the error and its causes.
    #[error("connecting to the upstream failed: {0}")]
    Connect(String),
    /// The exchange failed.
    #[error(transparent)]
    Http(#[from] hyper::Error),
}

/// The upstream's address and this worker's connections to it.
pub(super) struct Pool {
    /// `http://host:port`.
    address: Uri,
    connector: HttpConnector,
    /// Most recently parked last.
    parked: Mutex<VecDeque<(SendRequest<RequestBody>, Instant)>>,
}

impl Pool {
    /// Connections to `address` (`http://host:port`), each made within `connect_timeout`.
    pub(super) fn new(address: Uri, connect_timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(connect_timeout));
        Self {
            address,
            connector,
            parked: Mutex::default(),
        }
    }

    /// Sends `request` (origin-form, with its Host header) on a ready connection, else a new one (also
    /// once more when its connection closed before sending it), and returns the response headers.
    pub(super) async fn send(
        &self,
        request: Request<RequestBody>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let mut sender = match self.checkout() {
            Some(sender) => sender,
            None => self.connect().await?,
        };
        // (The error is gone before the retry's awaits: every request's future, moved whole by hyper,
        // would otherwise carry room for it.)
        let request = match sender.try_send_request(request).await {
            Ok(response) => {
                self.park(sender);
                return Ok(response);
            }
            Err(mut error) => match error.take_message() {
                Some(request) => request,
                None => return Err(error.into_error().into()),
            },
        };
        sender = self.connect().await?;
        let response = sender.send_request(request).await?;
        self.park(sender);
        Ok(response)
    }

    /// Parks `sender`'s connection, which answered, for the next request.
    fn park(&self, sender: SendRequest<RequestBody>) {
        let mut parked = self.lock();
        if parked.len() >= MAX_IDLE {
            parked.pop_front();
        }
        parked.push_back((sender, Instant::now()));
    }

    /// The most recently parked connection that can take a request now, if any.
    fn checkout(&self) -> Option<SendRequest<RequestBody>> {
        let mut parked = self.lock();
        while parked
            .front()
            .is_some_and(|(_, since)| since.elapsed() > IDLE_TIMEOUT)
        {
            parked.pop_front();
        }
        match parked.iter().rposition(|(sender, _)| sender.is_ready()) {
            Some(ready) => parked.remove(ready).map(|(sender, _)| sender),
            None => {
                parked.retain(|(sender, _)| !sender.is_closed());
                None
            }
        }
    }

    async fn connect(&self) -> Result<SendRequest<RequestBody>, UpstreamError> {
        let io = self
            .connector
            .clone()
            .call(self.address.clone())
            .await
            // "tcp connect error: Connection refused (os error 111)": the message and its causes.
            .map_err(|error| UpstreamError::Connect(format!("{:#}", anyhow::Error::new(error))))?;
        let (sender, connection) = http1::handshake(io).await?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "upstream connection ended");
            }
        });
        Ok(sender)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(SendRequest<RequestBody>, Instant)>> {
        self.parked.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
