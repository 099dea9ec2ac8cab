//! [`ConnOptions`]: where Redis is and how long to wait for it, as a store's builder sets them; and the
//! client of one server they make.

use std::time::Duration;

use redis::aio::ConnectionManagerConfig;
use redis::io::tcp::TcpSettings;
use redis::{Client, IntoConnectionInfo};

use crate::error::StoreError;

/// How to reach Redis.
#[derive(Clone, Debug)]
pub(crate) struct ConnOptions {
    /// One server, a cluster or the sentinels (the forms `RedisStoreBuilder::open` lists).
    pub(crate) url: String,
    /// How long to wait for an answer before the store counts as unavailable.
    pub(crate) response_timeout: Duration,
    /// How long one connection attempt may take.
    pub(crate) connection_timeout: Duration,
    /// For `rediss://`: the CA certificate (PEM) to trust instead of the web's (set with `tls` only).
    pub(crate) root_cert: Option<Vec<u8>>,
}

impl ConnOptions {
    /// Options for `url`, with 1 s timeouts.
    pub(crate) fn new(url: String) -> Self {
        Self {
            url,
            response_timeout: Duration::from_secs(1),
            connection_timeout: Duration::from_secs(1),
            root_cert: None,
        }
    }

    /// The connection manager's timeouts and reconnection (one server, or the primary Sentinel names).
    pub(super) fn manager_config(&self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.response_timeout))
            .set_connection_timeout(Some(self.connection_timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(100))
    }
}

/// The part of `url` after `redis+<kind>://` or `rediss+<kind>://`, and its scheme (`redis` or `rediss`).
pub(super) fn strip_scheme<'a>(url: &'a str, kind: &str) -> Option<(&'a str, &'static str)> {
    ["redis", "rediss"].into_iter().find_map(|scheme| {
        let rest = url
            .strip_prefix(scheme)?
            .strip_prefix('+')?
            .strip_prefix(kind)?;
        Some((rest.strip_prefix("://")?, scheme))
    })
}

pub(super) fn invalid_url(why: impl std::fmt::Display) -> StoreError {
    StoreError::Rejected(format!("invalid Redis URL: {why}"))
}

/// A client of one server, with TCP_NODELAY, trusting `root_cert` (PEM) if given.
pub(super) fn client(
    info: impl IntoConnectionInfo,
    root_cert: Option<&[u8]>,
) -> Result<Client, StoreError> {
    let info = info
        .into_connection_info()
        .map_err(invalid_url)?
        .set_tcp_settings(TcpSettings::default().set_nodelay(true));
    #[cfg(feature = "tls")]
    let client = match root_cert {
        Some(pem) => Client::build_with_tls(
            info,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.to_vec()),
            },
        ),
        None => Client::open(info),
    };
    #[cfg(not(feature = "tls"))]
    let client = {
        let _ = root_cert;
        Client::open(info)
    };
    client.map_err(invalid_url)
}
