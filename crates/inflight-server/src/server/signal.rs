//! Shutdown signals: the first drains, a second ends the process at once.

use std::future::Future;

/// Completes on Ctrl-C or SIGTERM; a second one, while the server drains, ends the process at once (exit
/// code 130). The handlers are installed when this is called, not when first polled.
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
            next_signal(&mut term, &mut int).await;
            tracing::info!("shutting down (a second signal ends the process at once)");
            tokio::spawn(async move {
                next_signal(&mut term, &mut int).await;
                tracing::warn!(
                    "a second signal: exiting now, without waiting for running responses"
                );
                std::process::exit(130);
            });
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            tracing::info!("shutting down");
        }
    }
}

/// The next SIGTERM or SIGINT (never, for one whose handler could not be installed).
#[cfg(unix)]
async fn next_signal(
    term: &mut Option<tokio::signal::unix::Signal>,
    int: &mut Option<tokio::signal::unix::Signal>,
) {
    tokio::select! {
        () = recv(term) => {}
        () = recv(int) => {}
    }
}

/// The next signal of `signal` (never, without a handler).
#[cfg(unix)]
async fn recv(signal: &mut Option<tokio::signal::unix::Signal>) {
    match signal {
        Some(signal) => drop(signal.recv().await),
        None => std::future::pending().await,
    }
}
