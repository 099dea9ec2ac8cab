//! TLS on the served port (`serve`'s listener, the proxy's proxied port): the certificate and its key,
//! read from PEM files, into a rustls server configuration (ring, ALPN `h2` and `http/1.1`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;
use serde::{Deserialize, Serialize};

use super::{invalid, ConfigError};

/// The protocols offered in the TLS handshake (ALPN), preferred first: HTTP/2, which browsers speak only
/// over TLS, then HTTP/1.1.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// TLS on the served port.
#[derive(Clone, Debug, Default, Args, Serialize, Deserialize)]
#[command(next_help_heading = "TLS")]
pub struct TlsSettings {
    /// Serve TLS (ALPN: HTTP/2, then HTTP/1.1) with this certificate chain (PEM, the server's
    /// certificate first); needs --tls-key. A handshake has --header-timeout to finish. The proxy's
    /// --admin-listen stays plain HTTP. SIGHUP re-reads the files: new connections get the new
    /// certificate.
    #[arg(long, env = "INFLIGHT_TLS_CERT", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "INFLIGHT_TLS_KEY", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
}

impl TlsSettings {
    /// Checks that both files or neither are given, and that they hold a certificate and its key.
    pub fn check(&self) -> Result<(), ConfigError> {
        self.server_config().map(drop)
    }

    /// The rustls configuration the files describe (read now), or `None` without TLS.
    pub fn server_config(&self) -> Result<Option<Arc<ServerConfig>>, ConfigError> {
        let (cert, key) = match (&self.tls_cert, &self.tls_key) {
            (None, None) => return Ok(None),
            (Some(cert), Some(key)) => (cert, key),
            (Some(_), None) => return Err(invalid("tls_key", "--tls-cert needs --tls-key")),
            (None, Some(_)) => return Err(invalid("tls_cert", "--tls-key needs --tls-cert")),
        };
        let chain = CertificateDer::pem_slice_iter(&read("tls_cert", cert)?)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid("tls_cert", format!("{}: {e}", cert.display())))?;
        if chain.is_empty() {
            let reason = format!("{}: no PEM certificate in it", cert.display());
            return Err(invalid("tls_cert", reason));
        }
        let private = PrivateKeyDer::from_pem_slice(&read("tls_key", key)?)
            .map_err(|e| invalid("tls_key", format!("{}: {e}", key.display())))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("tls_cert", e))?
            .with_no_client_auth()
            .with_single_cert(chain, private)
            .map_err(|e| {
                let reason = format!("{} with {}: {e}", key.display(), cert.display());
                invalid("tls_key", reason)
            })?;
        config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
        Ok(Some(Arc::new(config)))
    }
}

/// The bytes of the file `path` that `setting` names.
fn read(setting: &str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|e| invalid(setting, format!("{}: {e}", path.display())))
}
