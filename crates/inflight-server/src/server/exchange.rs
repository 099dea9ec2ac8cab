//! One connection's exchanges (a request, from its headers to the end of its response): how long the
//! connection may now wait for its client, and whether what hyper writes belongs to a response.
//!
//! Between exchanges an HTTP/1 connection waits for the next request's headers: `--idle-timeout` until
//! their first byte, then `--header-timeout` (from the opening, for a new connection). An HTTP/2
//! connection with no stream open waits `--idle-timeout` (its frames between streams are no request).
//! During an exchange the connection has no deadline: the request's body has its own (`--body-timeout`),
//! and the response takes as long as its upstream (`--upstream-timeout` until its headers).

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Instant;

/// The exchanges of one connection; clones share them.
#[derive(Clone)]
pub(super) struct Exchanges(Arc<Mutex<State>>);

struct State {
    /// Requests begun (their headers read, the service called).
    begun: u64,
    /// Responses ended (their body ended, or dropped).
    ended: u64,
    /// Responses every byte of which hyper has handed over: `ended` as of the last flush.
    flushed: u64,
    http2: bool,
    /// When the connection opened, or its last exchange ended.
    idle_since: Instant,
    /// When the next request's headers began (the opening, for a new connection), between exchanges.
    head_since: Option<Instant>,
    header_timeout: Duration,
    idle_timeout: Duration,
    /// The task reading the connection, woken when the last exchange ends to wait with a deadline again.
    reader: Option<Waker>,
}

impl Exchanges {
    /// A new connection's, opened now.
    pub(super) fn new(header_timeout: Duration, idle_timeout: Duration) -> Self {
        let now = Instant::now();
        Self(Arc::new(Mutex::new(State {
            begun: 0,
            ended: 0,
            flushed: 0,
            http2: false,
            idle_since: now,
            head_since: Some(now),
            header_timeout,
            idle_timeout,
            reader: None,
        })))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A request's headers are in: its exchange runs until the [`Ongoing`] is dropped.
    pub(super) fn begin(&self, version: http::Version) -> Ongoing {
        let mut state = self.lock();
        state.begun += 1;
        state.head_since = None;
        state.http2 |= version == http::Version::HTTP_2;
        Ongoing(self.clone())
    }

    /// Bytes came from the client.
    pub(super) fn read(&self) {
        let mut state = self.lock();
        if state.begun == state.ended && state.head_since.is_none() && !state.http2 {
            state.head_since = Some(Instant::now());
        }
    }

    /// Until when the connection may wait for its client now (none during an exchange); `reader` is
    /// woken when that changes to a deadline.
    pub(super) fn deadline(&self, reader: &Waker) -> Option<Instant> {
        let mut state = self.lock();
        if !state.reader.as_ref().is_some_and(|w| w.will_wake(reader)) {
            state.reader = Some(reader.clone());
        }
        if state.begun > state.ended {
            return None;
        }
        Some(match state.head_since {
            Some(since) => since + state.header_timeout,
            None => state.idle_since + state.idle_timeout,
        })
    }

    /// Hyper has flushed what it wrote: every response ended by now is out.
    pub(super) fn flushed(&self) {
        let mut state = self.lock();
        state.flushed = state.ended;
    }

    /// True when a write belongs to a response (or a `100 Continue`): a request has begun whose response
    /// is not all out; else hyper writes on its own (refusing an unreadable request, HTTP/2's frames).
    pub(super) fn in_response(&self) -> bool {
        let state = self.lock();
        state.begun > state.flushed
    }

    fn end(&self) {
        let mut state = self.lock();
        state.ended += 1;
        if state.ended == state.begun {
            state.idle_since = Instant::now();
            if let Some(reader) = state.reader.take() {
                drop(state);
                reader.wake();
            }
        }
    }
}

/// A running exchange; it ends when this is dropped.
pub(super) struct Ongoing(Exchanges);

impl Drop for Ongoing {
    fn drop(&mut self) {
        self.0.end();
    }
}

pin_project! {
    /// A response's body, holding its exchange open until hyper drops it (once it has taken its end).
    pub(super) struct ResponseBody {
        #[pin]
        inner: axum::body::Body,
        ongoing: Ongoing,
    }
}

impl ResponseBody {
    pub(super) fn new(inner: axum::body::Body, ongoing: Ongoing) -> Self {
        Self { inner, ongoing }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
