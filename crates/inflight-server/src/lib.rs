//! # inflight-server
//!
//! The `inflight` binary as a library, so that tests (and embedders) run it in-process: [`api::router`]
//! (the HTTP limiter API), [`proxy::router`] (the reverse proxy), [`server::run`] (serve until shutdown),
//! [`config::Settings`] (flags > environment > file > defaults).
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod api;
pub mod app;
pub mod bench;
pub mod config;
pub mod error;
mod graceful;
pub mod metrics;
pub mod proxy;
pub mod server;

use std::sync::Arc;

use inflight::{Limiter, Store};

pub use app::App;
pub use config::Settings;

/// The limiter and app state that `settings` describe, over `store`.
pub fn app<S: Store>(settings: &Settings, store: S) -> Arc<App<S>> {
    let limiter = Limiter::builder(store)
        .policy(inflight::Policy::new(
            settings.default_limit,
            settings.max_limit,
        ))
        .lease(settings.lease)
        .on_store_failure(settings.on_store_failure)
        .build();
    Arc::new(App {
        limiter,
        admin_token: settings.admin_token.clone(),
        metrics: metrics::Metrics::new(settings.metrics_per_key),
        cut: tokio::sync::watch::Sender::new(false),
    })
}
