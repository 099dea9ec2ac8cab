//! A client connection as hyper reads and writes it: a read waits only until the connection's deadline
//! ([`Exchanges::deadline`]; past it the read fails and hyper closes the connection); a write waits at
//! most `--send-timeout` for the client to make room (a client that reads nothing of its answer is cut,
//! and the answer's permit released); and an automatic refusal hyper writes is replaced by its JSON
//! ([`super::refusal`]).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::exchange::Exchanges;
use super::refusal;

pub(super) struct Guarded<I> {
    io: I,
    exchanges: Exchanges,
    timer: Pin<Box<Sleep>>,
    /// How long a write may wait for the client; the deadline of the one waiting now, if one is.
    send_timeout: Duration,
    send_timer: Pin<Box<Sleep>>,
    sending: bool,
    /// Our refusal in place of hyper's, and how much of it is out; hyper writes nothing after it.
    refusal: Option<(Vec<u8>, usize)>,
}

impl<I> Guarded<I> {
    pub(super) fn new(io: I, exchanges: Exchanges, send_timeout: Duration) -> Self {
        Self {
            io,
            exchanges,
            timer: Box::pin(tokio::time::sleep_until(Instant::now())),
            send_timeout,
            send_timer: Box::pin(tokio::time::sleep_until(Instant::now())),
            sending: false,
            refusal: None,
        }
    }

    /// `written` (a write's outcome), or a timeout when writes have waited `send_timeout` in a row.
    fn sent<T>(
        &mut self,
        cx: &mut Context<'_>,
        written: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if written.is_ready() {
            self.sending = false;
            return written;
        }
        if !self.sending {
            self.sending = true;
            let deadline = Instant::now() + self.send_timeout;
            self.send_timer.as_mut().reset(deadline);
        }
        let why = "the client read nothing of its answer in time";
        expired(&mut self.send_timer, cx, why)
    }
}

/// Pending until `timer` fires; then the timeout `why`.
fn expired<T>(timer: &mut Pin<Box<Sleep>>, cx: &mut Context<'_>, why: &str) -> Poll<io::Result<T>> {
    std::task::ready!(timer.as_mut().poll(cx));
    Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, why)))
}

impl<I: AsyncWrite + Unpin> Guarded<I> {
    /// Writes out what is left of our refusal.
    fn poll_refusal(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some((answer, sent)) = &mut self.refusal else {
            return Poll::Ready(Ok(()));
        };
        while *sent < answer.len() {
            match std::task::ready!(Pin::new(&mut self.io).poll_write(cx, &answer[*sent..]))? {
                0 => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                n => *sent += n,
            }
        }
        Poll::Ready(Ok(()))
    }

    /// True when `first` (the start of a write) is hyper's own refusal, which is then ours to send.
    fn refuses(&mut self, first: &[u8], all: impl FnOnce() -> Vec<u8>) -> bool {
        if self.refusal.is_some() {
            return true;
        }
        if !first.starts_with(b"HTTP/1.") || self.exchanges.in_response() {
            return false;
        }
        match refusal::answer(&all()) {
            Some(answer) => {
                self.refusal = Some((answer, 0));
                true
            }
            None => false,
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Guarded<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        if let Poll::Ready(read) = Pin::new(&mut this.io).poll_read(cx, buf) {
            if buf.filled().len() > before {
                this.exchanges.read();
            }
            return Poll::Ready(read);
        }
        let Some(deadline) = this.exchanges.deadline(cx.waker()) else {
            return Poll::Pending;
        };
        if this.timer.deadline() != deadline {
            this.timer.as_mut().reset(deadline);
        }
        expired(&mut this.timer, cx, "the client sent no request in time")
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Guarded<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.refuses(buf, || buf.to_vec()) {
            // Taken: it goes out as our refusal, on the flush that hyper makes next.
            return Poll::Ready(Ok(buf.len()));
        }
        let written = Pin::new(&mut self.io).poll_write(cx, buf);
        self.sent(cx, written)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let first = bufs.iter().find(|buf| !buf.is_empty());
        let first = first.map_or(&[][..], |buf| &buf[..]);
        if self.refuses(first, || {
            bufs.iter().flat_map(|buf| buf.iter().copied()).collect()
        }) {
            return Poll::Ready(Ok(bufs.iter().map(|buf| buf.len()).sum()));
        }
        let written = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.sent(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let refused = self.poll_refusal(cx);
        std::task::ready!(self.sent(cx, refused))?;
        self.exchanges.flushed();
        let flushed = Pin::new(&mut self.io).poll_flush(cx);
        self.sent(cx, flushed)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let refused = self.poll_refusal(cx);
        std::task::ready!(self.sent(cx, refused))?;
        let shut = Pin::new(&mut self.io).poll_shutdown(cx);
        self.sent(cx, shut)
    }
}
