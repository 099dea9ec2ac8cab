//! A request's body as the API and the proxy read it: hyper's, ended by an error when the client takes
//! too long over it, so that a client cannot hold a request (and its permit) open by trickling its body.
//!
//! Two bounds ([`BodyLimits`]), on the time the server spends waiting for the client's bytes (the clock
//! stops while the reader is busy elsewhere, e.g. held back by a slow upstream): that time in all
//! (`--body-timeout`), and a minimum rate after the first [`RATE_GRACE`] of it (`--body-min-rate`): by
//! then, and at every moment after, the body must have brought at least the rate's worth of bytes for
//! the time waited past the grace.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Buf;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

/// What a body-reading error is made of: hyper's, or the timeout.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a body may take before the minimum rate applies.
pub const RATE_GRACE: Duration = Duration::from_secs(5);

/// How long a body may keep the server waiting.
#[derive(Clone, Copy, Debug)]
pub struct BodyLimits {
    /// The time waited for the client in all.
    pub timeout: Duration,
    /// Bytes a second at least, after [`RATE_GRACE`]; 0: no minimum.
    pub min_rate: u64,
}

impl BodyLimits {
    /// How long the server may have waited in all once `received` bytes came.
    fn allowance(&self, received: u64) -> Duration {
        if self.min_rate == 0 {
            return self.timeout;
        }
        let earned = Duration::from_secs_f64(received as f64 / self.min_rate as f64);
        self.timeout.min(RATE_GRACE.saturating_add(earned))
    }
}

pin_project! {
    /// See the module docs.
    pub struct RequestBody {
        #[pin]
        inner: Incoming,
        #[pin]
        wait: Sleep,
        limits: BodyLimits,
        // Bytes of data received.
        received: u64,
        // Time waited for the client before the current wait.
        waited: Duration,
        // When the current wait began, while the reader waits for the client.
        since: Option<Instant>,
    }
}

impl RequestBody {
    /// `inner` under `limits`. Call it inside a runtime.
    pub fn new(inner: Incoming, limits: BodyLimits) -> Self {
        Self {
            inner,
            wait: tokio::time::sleep_until(Instant::now() + limits.timeout),
            limits,
            received: 0,
            waited: Duration::ZERO,
            since: None,
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        if let Poll::Ready(frame) = this.inner.poll_frame(cx) {
            if let Some(since) = this.since.take() {
                *this.waited += since.elapsed();
            }
            if let Some(data) = frame.as_ref().and_then(|f| f.as_ref().ok()?.data_ref()) {
                *this.received += data.remaining() as u64;
            }
            return Poll::Ready(frame.map(|frame| frame.map_err(BoxError::from)));
        }
        let since = *this.since.get_or_insert_with(|| {
            let now = Instant::now();
            let left = this
                .limits
                .allowance(*this.received)
                .saturating_sub(*this.waited);
            this.wait.as_mut().reset(now + left);
            now
        });
        match this.wait.poll(cx) {
            Poll::Ready(()) => {
                let waited = *this.waited + since.elapsed();
                Poll::Ready(Some(Err(Box::new(BodyTimeout {
                    waited,
                    received: *this.received,
                    limits: *this.limits,
                }))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The client took too long over a request's body: the server waited this long for `received` bytes.
#[derive(Debug, thiserror::Error)]
#[error("{}", describe(self))]
pub struct BodyTimeout {
    waited: Duration,
    received: u64,
    limits: BodyLimits,
}

fn describe(timeout: &BodyTimeout) -> String {
    let BodyTimeout {
        waited,
        received,
        limits,
    } = timeout;
    let waited = Duration::from_millis(waited.as_millis() as u64);
    let waited = humantime::format_duration(waited);
    if limits.timeout <= limits.allowance(*received) {
        let timeout = humantime::format_duration(limits.timeout);
        format!(
            "The request's body did not arrive within {timeout} ({received} bytes in {waited})."
        )
    } else {
        let rate = limits.min_rate;
        format!(
            "The request's body arrived too slowly: {received} bytes in {waited}, under {rate} bytes/s after the first {}.",
            humantime::format_duration(RATE_GRACE)
        )
    }
}

/// The body timeout behind `error`, if that is what it comes from (through any chain of sources).
pub fn body_timeout<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a BodyTimeout> {
    std::iter::successors(Some(error), |cause| cause.source())
        .find_map(|cause| cause.downcast_ref::<BodyTimeout>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowance_grows_with_the_bytes_received_up_to_the_timeout() {
        let limits = BodyLimits {
            timeout: Duration::from_secs(30),
            min_rate: 1024,
        };
        assert_eq!(limits.allowance(0), RATE_GRACE);
        assert_eq!(limits.allowance(2048), RATE_GRACE + Duration::from_secs(2));
        assert_eq!(limits.allowance(1 << 30), Duration::from_secs(30));
        let no_rate = BodyLimits {
            min_rate: 0,
            ..limits
        };
        assert_eq!(no_rate.allowance(0), Duration::from_secs(30));
    }
}
