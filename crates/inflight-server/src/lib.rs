//! # inflight-server
//!
//! The `inflight` binary as a library, so that tests (and embedders) run it in-process: [`api::router`]
//! (the HTTP limiter API), [`proxy::Proxy`] (the reverse proxy), [`server::Workers`] (serve until
//! shutdown), [`config::Settings`] (flags > environment > file > defaults).
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod api;
pub mod app;
pub mod bench;
pub mod config;
pub mod error;
pub mod metrics;
pub mod proxy;
pub mod server;

use std::sync::Arc;

use inflight::{Limiter, Store};

pub use app::App;
pub use config::{ConfigError, ProxySettings, Settings};

/// Where and how the proxy that `settings` describe forwards.
pub fn upstream(settings: &ProxySettings) -> Result<proxy::Upstream, ConfigError> {
    Ok(proxy::Upstream {
        base: settings.upstream()?,
        key_header: settings.key_header()?,
        timeout: settings.upstream_timeout,
    })
}

/// The limiter and app state that `settings` describe, over `store`, recording into `metrics` (which the
/// apps of a server's workers share).
pub fn app<S: Store>(
    settings: &Settings,
    metrics: metrics::Metrics,
    store: S,
) -> Result<Arc<App<S>>, ConfigError> {
    let limiter = Limiter::builder(store)
        .policy(inflight::Policy::new(
            settings.default_limit,
            settings.max_limit,
        ))
        .lease(settings.lease)
        .on_store_failure(settings.failure_policy()?)
        .build();
    Ok(Arc::new(App {
        limiter,
        admin_token: settings.admin_token.clone().filter(|t| !t.is_empty()),
        metrics,
        cut: tokio::sync::watch::Sender::new(false),
    }))
}
