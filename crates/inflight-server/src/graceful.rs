//! Graceful shutdown of a worker's connections: once told to stop, each connection finishes the exchange
//! it is in and closes, and the worker waits until all have closed.
//!
//! hyper-util's `GracefulShutdown` does the same, but polls its stop signal (a watch channel's `changed()`,
//! which takes the channel's waiter lock) every time the connection is polled: about 470 instructions per
//! proxied request (`scripts/instructions.sh`). Here the signal is polled once to register the
//! connection's task for the wake-up, and again only once the channel's version says it has changed: an
//! atomic load per poll.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper_util::server::graceful::GracefulConnection;
use pin_project_lite::pin_project;
use tokio::sync::watch;

/// A worker's watch over its connections.
pub(crate) struct Connections {
    stopping: watch::Receiver<bool>,
    open: watch::Sender<()>,
}

impl Connections {
    /// Connections that stop once `stopping` turns true (or its sender is gone).
    pub(crate) fn new(stopping: watch::Receiver<bool>) -> Self {
        Self {
            stopping,
            open: watch::Sender::new(()),
        }
    }

    /// `connection`, finishing its current exchange and closing once told to stop; counted as open until
    /// it ends or is dropped. Spawn it as a task of its own: the stop signal wakes the task that first
    /// polled it.
    pub(crate) fn watch<C: GracefulConnection>(&self, connection: C) -> Watched<C> {
        let mut stop = self.stopping.clone();
        Watched {
            connection,
            changed: self.stopping.clone(),
            // Unconstrained: a poll out of the task's budget would return without registering the waker,
            // and this is polled again only once the signal may have come.
            stop: Some(Box::pin(tokio::task::unconstrained(async move {
                let _ = stop.wait_for(|stop| *stop).await;
            }))),
            registered: false,
            _open: self.open.subscribe(),
        }
    }

    /// Waits until every watched connection has ended.
    pub(crate) async fn all_closed(self) {
        self.open.closed().await;
    }
}

pin_project! {
    /// See [`Connections::watch`].
    pub(crate) struct Watched<C> {
        #[pin]
        connection: C,
        // Its version says, with one atomic load, whether the stop signal may have come.
        changed: watch::Receiver<bool>,
        // The stop signal; gone once it has come.
        stop: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
        // Whether `stop` has been polled once, so that the task is woken when the signal comes.
        registered: bool,
        _open: watch::Receiver<()>,
    }
}

impl<C: GracefulConnection> Future for Watched<C> {
    type Output = C::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Some(stop) = this.stop {
            // A task's waker stays the same, so once registered the signal wakes this task; until the
            // version changes, polling the signal again would only find it still pending.
            if !*this.registered || !matches!(this.changed.has_changed(), Ok(false)) {
                *this.registered = true;
                if stop.as_mut().poll(cx).is_ready() {
                    *this.stop = None;
                    this.connection.as_mut().graceful_shutdown();
                }
            }
        }
        this.connection.poll(cx)
    }
}
