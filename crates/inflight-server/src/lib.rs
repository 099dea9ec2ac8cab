//! # inflight-server
//!
//! The `inflight` binary as a library, so that tests (and embedders) run it in-process: [`api::router`]
//! (the HTTP limiter API), [`proxy::Proxy`] (the reverse proxy), [`server::Workers`] (serve until
//! shutdown), [`config::Settings`] (flags > environment > file > defaults).
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod api;
pub mod app;
pub mod auth;
pub mod bench;
pub mod config;
pub mod error;
pub mod incoming;
pub mod metrics;
pub mod proxy;
pub mod server;
pub mod status;

use std::sync::Arc;

use inflight::quota::QuotaStats;
use inflight::{AnyStore, Limiter, MemoryStore, SharedPolicy};

pub use app::App;
pub use config::{ConfigError, ProxySettings, Settings};

/// Where and how the proxy that `settings` describe forwards.
pub fn upstream(settings: &ProxySettings) -> Result<proxy::Upstream, ConfigError> {
    Ok(proxy::Upstream {
        base: settings.upstream()?,
        keys: settings.keys()?,
        on_missing_key: settings.on_missing_key()?,
        limit_paths: settings.limit_paths()?,
        quota_key: settings.quota_key()?,
        queue: settings.queue()?,
        holder: settings.holder()?,
        on_revoke: settings.on_revoke()?,
        timeout: settings.upstream_timeout,
        max_wait: settings.max_wait,
        api_on_proxy_port: settings.admin_on_proxy_port,
        trust_forwarded: settings.trust_forwarded,
        forward_token: settings.forward_token,
        access_log: settings.serve.logging.access_log,
    })
}

/// What the apps of a server's workers share: the metrics, the limits (so that a reload reaches every
/// worker), where `fail_open_local` counts and the listings of busy keys in progress (one cap per process,
/// not per worker).
#[derive(Clone)]
pub struct Shared {
    /// The server's metrics.
    pub metrics: metrics::Metrics,
    /// The limits, replaced by a reload.
    pub policy: SharedPolicy,
    /// The fallback store of `fail_open_local`.
    pub fallback: MemoryStore,
    /// How the workers' reservations have ended.
    pub quota_stats: Arc<QuotaStats>,
    /// The places of listings of busy keys in progress ([`app::MAX_LISTINGS`]).
    pub listings: app::Listings,
}

impl Shared {
    /// The shared state of a server that `settings` describe.
    pub fn new(settings: &Settings) -> Result<Self, ConfigError> {
        Ok(Self {
            metrics: metrics::Metrics::new(settings.metrics_per_key),
            policy: SharedPolicy::new(settings.policy()?),
            fallback: MemoryStore::new(),
            quota_stats: Arc::new(match settings.metrics_balances {
                true => QuotaStats::with_balances(metrics::MAX_BALANCE_KEYS),
                false => QuotaStats::default(),
            }),
            listings: app::Listings::default(),
        })
    }
}

/// The app state that `settings` describe, over `store`, with what the workers `shared`.
pub fn app(settings: &Settings, shared: &Shared, store: AnyStore) -> Result<Arc<App>, ConfigError> {
    // A cluster that lost a primary fails in part: its other primaries' keys go on.
    let cluster = settings.store_scheme().ends_with("+cluster");
    let (metrics, policy) = (shared.metrics.clone(), shared.policy.clone());
    let limiter = Limiter::builder(store)
        .on_shadow_refusal(move |key| metrics.shadow_refused(policy.get().class_of(key), key))
        .policy(shared.policy.clone())
        .lease(settings.lease)
        .on_store_failure(settings.failure_policy()?)
        .fallback(shared.fallback.clone())
        .max_waiters(settings.max_waiters)
        .store_breaker(!cluster)
        .build();
    // Beside the limiter: its task keeps reservations open and settles what dropped ones leave.
    let quota = limiter
        .quota()
        .with_ttl(settings.quota.quota_ttl)
        .with_commit_on(settings.quota.quota_commit.into())
        .with_stats(shared.quota_stats.clone());
    let tokens = auth::Tokens {
        admin: settings.admin_token()?,
        api: settings.api_token.clone().filter(|t| !t.is_empty()),
    };
    Ok(Arc::new(App {
        status: Arc::new(status::Board::new(
            limiter.clone(),
            shared.metrics.clone(),
            tokens.clone(),
            settings.connections.status_stream_lifetime,
        )),
        limiter,
        quota,
        tokens,
        overrides_for_classes_only: settings.overrides_for_classes_only,
        metrics: shared.metrics.clone(),
        cut: tokio::sync::watch::Sender::new(false),
        listings: shared.listings.clone(),
        priorities: Arc::from(settings.priorities.as_slice()),
    }))
}
