//! TLS on the served port: the certificate in force (replaced by a reload, for new connections), and
//! each connection's handshake within a bound.

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use rustls::ServerConfig;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::config::{ConfigError, TlsSettings};

/// The TLS configuration of a server's port; clones share it, so that a reload reaches every worker.
#[derive(Clone)]
pub struct Tls(Arc<RwLock<Arc<ServerConfig>>>);

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

impl Tls {
    /// TLS with the certificate and key that `settings` name (read now), or `None` when they name none.
    pub fn load(settings: &TlsSettings) -> Result<Option<Self>, ConfigError> {
        Ok(settings
            .server_config()?
            .map(|config| Self(Arc::new(RwLock::new(config)))))
    }

    /// Reads the certificate and key that `settings` name again, for the connections that open from now
    /// on. On an error (a file missing or bad, or no TLS named any more) the certificate in force stays.
    pub fn reload(&self, settings: &TlsSettings) -> Result<(), ConfigError> {
        let Some(config) = settings.server_config()? else {
            return Err(ConfigError {
                setting: "tls_cert".into(),
                reason: "TLS cannot be turned off by a reload: restart without --tls-cert".into(),
            });
        };
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = config;
        Ok(())
    }

    /// The TLS handshake of an accepted connection, with the certificate in force, within `timeout`.
    pub(super) async fn accept(
        &self,
        io: TcpStream,
        timeout: Duration,
    ) -> std::io::Result<TlsStream<TcpStream>> {
        let config = self
            .0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let handshake = TlsAcceptor::from(config).accept(io);
        tokio::time::timeout(timeout, handshake)
            .await
            .unwrap_or_else(|_| {
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the client did not finish the TLS handshake in time",
                ))
            })
    }
}
