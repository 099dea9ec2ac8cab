//! Running a server: the API or the proxy on a listener until shutdown, then a bounded grace period.

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use axum::Router;
use inflight::Store;

use crate::app::App;
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// How long, after the grace period, the cut streams get to close before the server stops waiting.
const CUT_WAIT: Duration = Duration::from_secs(1);

/// Serves `router` on `listener` until `shutdown` completes; then stops accepting, lets running responses
/// (proxied streams) finish for up to `grace`, ends the ones still running, and releases every permit the
/// limiter still holds.
pub async fn run<S: Store>(
    listener: TcpListener,
    router: Router,
    app: Arc<App<S>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    let signalled = Arc::new(Notify::new());
    let notify = signalled.clone();
    // Answers are small and latency matters: no Nagle delay on accepted connections.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let serve = axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async move {
        shutdown.await;
        notify.notify_one();
    });
    let mut server = tokio::spawn(serve.into_future());
    let result = tokio::select! {
        result = &mut server => result,
        () = async {
            signalled.notified().await;
            tokio::time::sleep(grace).await;
        } => {
            tracing::warn!(?grace, "grace period over: ending the responses still running");
            app.cut.send_replace(true);
            match tokio::time::timeout(CUT_WAIT, &mut server).await {
                Ok(result) => result,
                Err(_) => {
                    server.abort();
                    server.await
                }
            }
        }
    };
    app.limiter.release_held().await;
    match result {
        Ok(result) => result,
        Err(join) if join.is_cancelled() => Ok(()),
        Err(join) => Err(std::io::Error::other(join)),
    }
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
