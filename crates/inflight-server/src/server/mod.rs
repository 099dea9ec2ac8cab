//! Running a server: the API or the proxy on its workers until shutdown, then a bounded grace period.
//!
//! Each worker is a thread with its own single-threaded Tokio runtime, its own `SO_REUSEPORT` socket on
//! the shared address (the kernel spreads connections over them) and its own [`App`](crate::App) (with
//! Redis, its own store connection). A connection, its requests and its upstream connections stay on one
//! worker, so a client that sends everything over one connection is served by one worker.

use std::time::Duration;

use crate::config::Connections;

pub use gate::{ADMIN_CONNECTIONS, HEALTH_RESERVE};
pub use signal::shutdown_signal;
pub use tls::Tls;
pub use workers::{bind, Workers};

mod exchange;
mod gate;
mod guarded;
mod listen;
mod refusal;
mod routes;
mod signal;
mod tls;
mod workers;

/// How long, after the grace period, the cut streams get to close before the worker stops waiting.
const CUT_WAIT: Duration = Duration::from_secs(1);

/// The bounds of a server's connections, and its grace period.
#[derive(Clone, Debug)]
pub struct Bounds {
    /// How long, after a shutdown signal, running responses may finish.
    pub grace: Duration,
    /// The timeouts and caps of its connections.
    pub connections: Connections,
    /// TLS on the served port (not the admin listener), its handshake within `connections.header_timeout`;
    /// not made by `From<&Settings>`: load it with [`Tls::load`], and keep a clone to reload it.
    pub tls: Option<Tls>,
}

impl From<&crate::Settings> for Bounds {
    fn from(settings: &crate::Settings) -> Self {
        Self {
            grace: settings.shutdown_grace,
            connections: settings.connections.clone(),
            tls: None,
        }
    }
}
