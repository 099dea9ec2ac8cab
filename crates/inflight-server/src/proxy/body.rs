//! The body of a proxied response: the upstream's frames as they come, holding the permit, counted in
//! `inflight_in_flight`, and cut short if the server's shutdown grace period ends first. Read to the end,
//! it gives its upstream connection back to the pool.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use inflight::Permit;
use inflight_tower::PermitBody;
use pin_project_lite::pin_project;
use tokio::sync::watch;

use super::upstream::Reusable;
use crate::metrics::Held;

pin_project! {
    /// See the module docs.
    pub(super) struct ProxyBody {
        #[pin]
        inner: PermitBody<hyper::body::Incoming>,
        cut: Cut,
        connection: Option<Reusable>,
        _held: Held,
    }
}

impl ProxyBody {
    pub(super) fn new(
        inner: hyper::body::Incoming,
        permit: Permit,
        connection: Reusable,
        cut: watch::Receiver<bool>,
        held: Held,
    ) -> Self {
        let mut connection = Some(connection);
        if inner.is_end_stream() {
            // No body to read (the server will not ask for one): the connection goes back now. Should its
            // request body still be on its way up, it stays busy until then, and checkouts pass it over.
            give_back(&mut connection);
        }
        Self {
            inner: PermitBody::new(inner, Some(permit)),
            cut: Cut::Watching(cut),
            connection,
            _held: held,
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let mut this = self.project();
        if this.cut.is_cut(cx, false) {
            return cut_short();
        }
        let Poll::Ready(frame) = this.inner.as_mut().poll_frame(cx) else {
            // Waiting for the upstream: the cut must wake this body too.
            return if this.cut.is_cut(cx, true) {
                cut_short()
            } else {
                Poll::Pending
            };
        };
        match &frame {
            // Read to the end (the server may not ask again once `is_end_stream` says so).
            None => give_back(this.connection),
            Some(Ok(_)) if this.inner.is_end_stream() => give_back(this.connection),
            Some(Ok(_)) => {}
            // The rest of the response may still be on the connection: it is closed when dropped.
            Some(Err(_)) => drop(this.connection.take()),
        }
        Poll::Ready(frame.map(|frame| frame.map_err(axum::Error::new)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Whether the server's shutdown grace period is over. Checking costs one atomic load; only a body that
/// waits for its upstream registers to be woken by the cut (most bodies are read without waiting).
enum Cut {
    Watching(watch::Receiver<bool>),
    Waiting(Pin<Box<dyn Future<Output = ()> + Send>>),
}

impl Cut {
    /// True once cut (or once the server's end of the channel is gone). With `wake`, the task is woken
    /// when the cut comes, from then on.
    fn is_cut(&mut self, cx: &mut Context<'_>, wake: bool) -> bool {
        match self {
            Self::Watching(cut) if !wake => !matches!(cut.has_changed(), Ok(false)),
            Self::Watching(cut) => {
                let mut cut = cut.clone();
                *self = Self::Waiting(Box::pin(async move {
                    let _ = cut.wait_for(|cut| *cut).await;
                }));
                self.is_cut(cx, true)
            }
            Self::Waiting(waiting) => waiting.as_mut().poll(cx).is_ready(),
        }
    }
}

/// The grace period is over: the response ends with an error, which closes the connection.
fn cut_short() -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
    Poll::Ready(Some(Err(axum::Error::new("the server is shutting down"))))
}

fn give_back(connection: &mut Option<Reusable>) {
    if let Some(connection) = connection.take() {
        connection.give_back();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Wake, Waker};

    use super::*;

    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A waker, and the count of its wakes.
    fn counted() -> (Arc<Wakes>, Waker) {
        let wakes = Arc::new(Wakes::default());
        (wakes.clone(), Waker::from(wakes))
    }

    #[test]
    fn a_body_that_never_waited_sees_the_cut_when_next_read() {
        let (cut, receiver) = watch::channel(false);
        let mut watching = Cut::Watching(receiver);
        let (wakes, waker) = counted();
        let mut cx = Context::from_waker(&waker);
        assert!(!watching.is_cut(&mut cx, false));
        cut.send_replace(true);
        assert!(watching.is_cut(&mut cx, false));
        assert_eq!(
            wakes.0.load(Ordering::SeqCst),
            0,
            "it never asked to be woken"
        );
    }

    #[test]
    fn a_body_waiting_for_its_upstream_is_woken_by_the_cut() {
        let (cut, receiver) = watch::channel(false);
        let mut waiting = Cut::Watching(receiver);
        let (wakes, waker) = counted();
        let mut cx = Context::from_waker(&waker);
        assert!(!waiting.is_cut(&mut cx, true));
        assert!(!waiting.is_cut(&mut cx, false), "still not cut");
        cut.send_replace(true);
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "woken by the cut");
        assert!(waiting.is_cut(&mut cx, false));
    }

    #[test]
    fn a_server_gone_counts_as_cut() {
        let (cut, receiver) = watch::channel(false);
        let (mut watching, mut waiting) =
            (Cut::Watching(receiver.clone()), Cut::Watching(receiver));
        let (_, waker) = counted();
        let mut cx = Context::from_waker(&waker);
        assert!(!waiting.is_cut(&mut cx, true));
        drop(cut);
        assert!(watching.is_cut(&mut cx, false));
        assert!(waiting.is_cut(&mut cx, false));
    }
}
