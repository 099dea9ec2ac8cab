//! The worker threads: their listening sockets, each one's runtime and app, and their shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{oneshot, watch};

use super::gate::{self, Gate, ADMIN_CONNECTIONS, HEALTH_RESERVE};
use super::listen::{self, NoDelay, Served};
use super::routes::Routes;
use super::{Bounds, CUT_WAIT};
use crate::app::App;
use crate::proxy::Upstream;

/// Listening sockets for `workers` workers on `addr` (port 0 picks one port for all of them). Call it
/// inside a Tokio runtime. Fails, like a plain bind, when anything already listens on `addr`, even
/// another process's `SO_REUSEPORT` sockets. As with nginx's `reuseport`, a process of the same user that
/// binds the address with `SO_REUSEPORT` later (or at the very same moment) shares it.
pub fn bind(addr: SocketAddr, workers: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    let socket = || {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()
        } else {
            TcpSocket::new_v6()
        }?;
        socket.set_reuseaddr(true)?;
        Ok::<_, std::io::Error>(socket)
    };
    // First a socket without SO_REUSEPORT: its bind fails if the address is taken, and fixes the port.
    let first = socket()?;
    first.bind(addr)?;
    if workers <= 1 {
        return Ok(vec![first.listen(1024)?.into_std()?]);
    }
    let addr = first.local_addr()?;
    drop(first);
    (0..workers)
        .map(|_| {
            let socket = socket()?;
            socket.set_reuseport(true)?;
            socket.bind(addr)?;
            socket.listen(1024)?.into_std()
        })
        .collect()
}

/// What each worker calls in its own runtime to build its app (its limiter over its store).
type MakeApp = Arc<dyn Fn() -> anyhow::Result<Arc<App>> + Send + Sync>;

/// A server's worker threads, each serving its listener.
pub struct Workers {
    /// Stop accepting and finish what runs (within the grace period).
    stop: watch::Sender<bool>,
    /// End at once; dropped with this, which ends the workers too.
    end: watch::Sender<bool>,
    ended: FuturesUnordered<oneshot::Receiver<std::io::Result<()>>>,
    /// The cap on the served port's connections, as lowered to the limit of open files.
    max_connections: usize,
}

impl Workers {
    /// Starts a worker on each of `listeners`, which builds its app with `app` and serves the API (or
    /// the proxy to `upstream`); returns once every worker has built its app, or with the first error.
    /// Dropping the workers ends them at once.
    pub async fn start(
        listeners: Vec<std::net::TcpListener>,
        app: impl Fn() -> anyhow::Result<Arc<App>> + Send + Sync + 'static,
        upstream: Option<Upstream>,
        bounds: Bounds,
        admin: Option<std::net::TcpListener>,
    ) -> anyhow::Result<Self> {
        if listeners.is_empty() {
            anyhow::bail!("no listener to serve on");
        }
        let app: MakeApp = Arc::new(app);
        let (gates, max_connections) = gates(
            &bounds,
            listeners.len(),
            upstream.is_some(),
            admin.is_some(),
        );
        let upstream = upstream.map(Arc::new);
        let bounds = Arc::new(bounds);
        let workers = Self {
            stop: watch::Sender::new(false),
            end: watch::Sender::new(false),
            ended: FuturesUnordered::new(),
            max_connections,
        };
        let mut started = Vec::new();
        let mut admin = admin;
        for (n, listener) in listeners.into_iter().enumerate() {
            let (ready, is_ready) = oneshot::channel();
            let (done, ended) = oneshot::channel();
            let worker = Worker {
                app: app.clone(),
                upstream: upstream.clone(),
                bounds: bounds.clone(),
                gates: gates.clone(),
                admin: admin.take(),
                stopping: workers.stop.subscribe(),
                ending: workers.end.subscribe(),
            };
            std::thread::Builder::new()
                .name(format!("inflight-worker-{n}"))
                .spawn(move || {
                    let _ = done.send(worker.run(listener, ready));
                })?;
            started.push(is_ready);
            workers.ended.push(ended);
        }
        for ready in started {
            ready
                .await
                .unwrap_or_else(|_| Err(anyhow::anyhow!("a worker thread ended at start")))?;
        }
        Ok(workers)
    }

    /// The cap on the served port's open connections (`--max-connections`, lowered to fit open files).
    pub fn max_connections(&self) -> usize {
        self.max_connections
    }

    /// Serves until `shutdown` completes; then each worker stops accepting, lets running responses finish
    /// within the grace period (then ends them), and releases every permit its limiter still holds.
    /// Should a worker fail, the others end at once.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut first_error = None;
        loop {
            tokio::select! {
                () = &mut shutdown, if !*self.stop.borrow() => {
                    self.stop.send_replace(true);
                }
                ended = self.ended.next() => match ended {
                    None => break,
                    Some(Ok(Ok(()))) => {}
                    Some(Ok(Err(error))) => {
                        self.end.send_replace(true);
                        first_error.get_or_insert(error);
                    }
                    Some(Err(_)) => {
                        self.end.send_replace(true);
                        first_error.get_or_insert(std::io::Error::other("a worker thread panicked"));
                    }
                },
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

struct Worker {
    app: MakeApp,
    upstream: Option<Arc<Upstream>>,
    bounds: Arc<Bounds>,
    gates: Gates,
    /// The admin listener (the first worker serves it, with the plain API).
    admin: Option<std::net::TcpListener>,
    stopping: watch::Receiver<bool>,
    ending: watch::Receiver<bool>,
}

impl Worker {
    /// Builds the worker's app on a runtime of its own (and says so on `ready`), then serves `listener`
    /// until told to stop (and its connections have closed) or to end; its runtime goes with it.
    fn run(
        mut self,
        listener: std::net::TcpListener,
        ready: oneshot::Sender<anyhow::Result<()>>,
    ) -> std::io::Result<()> {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(error) => {
                let _ = ready.send(Err(anyhow::anyhow!(
                    "cannot start a worker's runtime: {error}"
                )));
                return Ok(());
            }
        };
        let served = runtime.block_on(async move {
            let admin = self.admin.map(TcpListener::from_std).transpose();
            let started = TcpListener::from_std(listener)
                .and_then(|listener| Ok((listener, admin?)))
                .map_err(anyhow::Error::from)
                .and_then(|(listener, admin)| {
                    Ok((NoDelay(listener), admin.map(NoDelay), (self.app)()?))
                });
            let (listener, admin, app) = match started {
                Ok(started) => {
                    let _ = ready.send(Ok(()));
                    started
                }
                Err(error) => {
                    let _ = ready.send(Err(error));
                    return Ok(());
                }
            };
            let serve = |listener, upstream, gate, tls| {
                let served = Served {
                    listener,
                    routes: Routes::new(&app, upstream, &self.stopping),
                    health: Routes::health(&app),
                    gate,
                    tls,
                };
                listen::serve(served, self.stopping.clone(), &self.bounds, &app.cut)
            };
            let upstream = self.upstream.as_deref();
            let proxied = serve(
                listener,
                upstream,
                self.gates.served,
                self.bounds.tls.clone(),
            );
            let admin = async {
                if let Some(admin) = admin {
                    // Plain HTTP: the admin listener is for the operator's tools, on loopback by default.
                    serve(admin, None, self.gates.admin, None).await;
                }
            };
            tokio::select! {
                ((), ()) = async { tokio::join!(proxied, admin) } => {
                    // What was dropped is being released in the background; this releases the rest and
                    // waits for those.
                    app.limiter.release_leases().await;
                    if *app.cut.borrow() {
                        return Err(std::io::Error::other(
                            "responses still running at the end of the grace period were cut",
                        ));
                    }
                }
                _ = self.ending.wait_for(|end| *end) => {}
            }
            Ok(())
        });
        // Connections still open are dropped with the runtime; a blocking task (a DNS lookup of the upstream)
        // is not waited for past this.
        runtime.shutdown_timeout(CUT_WAIT);
        served
    }
}

/// The connection caps of a process: one over the served port's listeners, one for the admin listener.
#[derive(Clone)]
struct Gates {
    served: Gate,
    admin: Gate,
}

/// The caps of a server with `workers` listeners (a proxy when `proxy`, with an admin listener when
/// `admin`), and the cap on the served port, lowered (with a warning) to fit the limit of open files.
fn gates(bounds: &Bounds, workers: usize, proxy: bool, admin: bool) -> (Gates, usize) {
    let wanted = bounds.connections.max_connections;
    let (files_each, others) = match (proxy, admin) {
        (true, true) => (2, ADMIN_CONNECTIONS),
        (true, false) => (2, 0),
        (false, _) => (1, HEALTH_RESERVE),
    };
    // Each worker has its listener, and may hold a connection it accepted that waits for a place.
    let (cap, lowered_by) = gate::cap(wanted, files_each, others + 2 * workers);
    if let Some(limit) = lowered_by {
        tracing::warn!(
            max_connections = wanted,
            open_files_limit = limit,
            lowered_to = cap,
            "--max-connections lowered to what the limit of open files (ulimit -n) leaves room for"
        );
    }
    let gates = Gates {
        // The proxied port has no reserve: /healthz answers on the admin listener.
        served: Gate::new(cap, if proxy { 0 } else { HEALTH_RESERVE }),
        admin: Gate::new(ADMIN_CONNECTIONS, 0),
    };
    (gates, cap)
}
