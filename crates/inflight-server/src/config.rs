//! Settings: flags > environment > TOML file > defaults, each bad value named by its setting.
//!
//! Every flag has an `INFLIGHT_*` variable. When `INFLIGHT_DEFAULT_LIMIT` / `INFLIGHT_MAX_LIMIT` are unset,
//! the reference system's `APP_DEFAULT_ACTIVE_REQUESTS` / `APP_MAX_ACTIVE_REQUESTS` are honoured, so an
//! existing Dify deployment's settings carry over.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use figment::providers::{Format, Serialized, Toml};
use figment::Figment;
use inflight::FailurePolicy;
use serde::{Deserialize, Serialize};

/// `inflight`: per-key in-flight limits as a service.
#[derive(Debug, Parser)]
#[command(name = "inflight", version, about)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The HTTP limiter API, for workers in any language.
    Serve(CommonArgs),
    /// A reverse proxy that enforces the limits in front of an upstream API (and answers the API under
    /// /_inflight/).
    Proxy(ProxyArgs),
    /// Drives the library directly (no HTTP) and prints one JSON line of throughput and latency.
    Bench(crate::bench::BenchArgs),
}

/// Options of every command. Each also comes from its `INFLIGHT_*` variable and from the TOML file.
#[derive(Clone, Debug, Default, Args, Serialize)]
pub struct CommonArgs {
    /// Address to listen on [default: 127.0.0.1:8080].
    #[arg(long, env = "INFLIGHT_LISTEN", value_name = "ADDR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// Worker threads serving connections, each with its own runtime and listening socket [default: one
    /// per CPU core].
    #[arg(long, env = "INFLIGHT_WORKERS", value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers: Option<usize>,
    /// Where leases live: memory:// (embedded), redis://host:port[/db], rediss://..., unix:///path
    /// [default: memory://].
    #[arg(long, env = "INFLIGHT_STORE", value_name = "URL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// Limit of a key without an override; 0 = unlimited [default: 0; env fallback
    /// APP_DEFAULT_ACTIVE_REQUESTS].
    #[arg(long, env = "INFLIGHT_DEFAULT_LIMIT", value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_limit: Option<u32>,
    /// Ceiling over every key's limit; 0 = none [default: 0; env fallback APP_MAX_ACTIVE_REQUESTS].
    #[arg(long, env = "INFLIGHT_MAX_LIMIT", value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_limit: Option<u32>,
    /// Lease of a permit unless its request asks for another, e.g. 30s, 500ms [default: 30s].
    #[arg(long, env = "INFLIGHT_LEASE", value_name = "DURATION")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// Bearer token that changing limits requires (unset: no token needed).
    #[arg(
        long,
        env = "INFLIGHT_ADMIN_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_token: Option<String>,
    /// When the store is unreachable: fail_closed (503), fail_open (admit), fail_open_local (admit under a
    /// per-process cap) [default: fail_closed].
    #[arg(long, env = "INFLIGHT_ON_STORE_FAILURE", value_name = "POLICY")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_store_failure: Option<String>,
    /// The per-process, per-key cap under fail_open_local [default: 1].
    #[arg(long, env = "INFLIGHT_FAIL_OPEN_LOCAL_LIMIT", value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fail_open_local_limit: Option<u32>,
    /// Label metrics with each key (high cardinality: only with few keys) [default: false].
    #[arg(long, env = "INFLIGHT_METRICS_PER_KEY", value_name = "BOOL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_per_key: Option<bool>,
    /// How long, after SIGTERM or Ctrl-C, running responses may finish [default: 30s].
    #[arg(long, env = "INFLIGHT_SHUTDOWN_GRACE", value_name = "DURATION")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shutdown_grace: Option<String>,
    /// Prefix of every Redis key [default: inflight:].
    #[arg(long, env = "INFLIGHT_REDIS_PREFIX", value_name = "PREFIX")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_prefix: Option<String>,
    /// For rediss:// stores signed by a private CA: its certificate (PEM file). Needs the `tls` feature.
    #[arg(long, env = "INFLIGHT_REDIS_CA_CERT", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_ca_cert: Option<PathBuf>,
    /// Batches of admissions and releases out to Redis at once from each worker, 1 to 64: fewer makes
    /// batches larger and Redis calls fewer (BENCHMARKS.md, "Redis pipeline") [default: 1].
    #[arg(long, env = "INFLIGHT_REDIS_PIPELINE", value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_pipeline: Option<usize>,
    /// A TOML file with any of these settings (flags and environment win over it).
    #[arg(long, env = "INFLIGHT_CONFIG", value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
}

/// Options of `inflight proxy`.
#[derive(Clone, Debug, Default, Args, Serialize)]
pub struct ProxyArgs {
    /// The API to forward to, e.g. http://127.0.0.1:5001.
    #[arg(long, env = "INFLIGHT_UPSTREAM", value_name = "URL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// The request header whose value is the key [default: X-Inflight-Key].
    #[arg(long, env = "INFLIGHT_KEY_HEADER", value_name = "NAME")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_header: Option<String>,
    /// How long to wait for the upstream's response headers [default: 60s].
    #[arg(long, env = "INFLIGHT_UPSTREAM_TIMEOUT", value_name = "DURATION")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_timeout: Option<String>,
    /// The options every command has.
    #[command(flatten)]
    #[serde(flatten)]
    pub common: CommonArgs,
}

/// Every setting as layered, before checking.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    listen: Option<String>,
    workers: Option<usize>,
    store: Option<String>,
    default_limit: Option<u32>,
    max_limit: Option<u32>,
    lease: Option<String>,
    admin_token: Option<String>,
    on_store_failure: Option<String>,
    fail_open_local_limit: Option<u32>,
    metrics_per_key: Option<bool>,
    shutdown_grace: Option<String>,
    redis_prefix: Option<String>,
    redis_ca_cert: Option<PathBuf>,
    redis_pipeline: Option<usize>,
    upstream: Option<String>,
    key_header: Option<String>,
    upstream_timeout: Option<String>,
}

/// The checked settings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Where to listen.
    pub listen: SocketAddr,
    /// How many worker threads serve connections.
    pub workers: usize,
    /// The store URL.
    pub store: String,
    /// The default limit (0 = unlimited).
    pub default_limit: u32,
    /// The ceiling (0 = none).
    pub max_limit: u32,
    /// The default lease.
    pub lease: Duration,
    /// The admin token, if any.
    pub admin_token: Option<String>,
    /// What to do when the store is unreachable.
    pub on_store_failure: FailurePolicy,
    /// Per-key metric labels.
    pub metrics_per_key: bool,
    /// The shutdown grace period.
    pub shutdown_grace: Duration,
    /// The Redis key prefix.
    pub redis_prefix: String,
    /// The CA certificate (PEM) that a rediss:// store's certificate is checked against, if not the web's.
    pub redis_ca_cert: Option<Vec<u8>>,
    /// Batches out to Redis at once, at most.
    pub redis_pipeline: usize,
    /// The proxy's upstream (proxy only).
    pub upstream: Option<http::Uri>,
    /// The proxy's key header.
    pub key_header: http::HeaderName,
    /// The proxy's wait for response headers.
    pub upstream_timeout: Duration,
}

/// A setting that could not be used: names the setting and says why.
#[derive(Debug, thiserror::Error)]
#[error("invalid setting `{setting}`: {reason}")]
pub struct ConfigError {
    /// The setting (its flag / TOML name).
    pub setting: String,
    /// What is wrong with it.
    pub reason: String,
}

/// The most worker threads a server runs.
const MAX_WORKERS: usize = 1024;

fn invalid(setting: &str, reason: impl std::fmt::Display) -> ConfigError {
    ConfigError {
        setting: setting.to_owned(),
        reason: reason.to_string(),
    }
}

impl Settings {
    /// The settings of `inflight serve`.
    pub fn for_serve(args: &CommonArgs) -> Result<Self, ConfigError> {
        let args = with_dify_aliases(args.clone())?;
        Self::layer(args.config.as_deref(), Serialized::defaults(&args))
    }

    /// The settings of `inflight proxy`; an upstream is required.
    pub fn for_proxy(args: &ProxyArgs) -> Result<Self, ConfigError> {
        let mut args = args.clone();
        args.common = with_dify_aliases(args.common)?;
        let settings = Self::layer(args.common.config.as_deref(), Serialized::defaults(&args))?;
        if settings.upstream.is_none() {
            return Err(invalid(
                "upstream",
                "`inflight proxy` needs --upstream URL (or INFLIGHT_UPSTREAM)",
            ));
        }
        Ok(settings)
    }

    fn layer(
        file: Option<&std::path::Path>,
        cli: Serialized<impl Serialize>,
    ) -> Result<Self, ConfigError> {
        let mut figment = Figment::new();
        if let Some(path) = file {
            if !path.exists() {
                return Err(invalid(
                    "config",
                    format!("{} does not exist", path.display()),
                ));
            }
            figment = figment.merge(Toml::file(path));
        }
        let raw: Raw = figment.merge(cli).extract().map_err(|e| {
            let setting = e
                .path
                .last()
                .cloned()
                .unwrap_or_else(|| "config".to_owned());
            invalid(&setting, e.kind)
        })?;
        Self::check(raw)
    }

    fn check(raw: Raw) -> Result<Self, ConfigError> {
        let listen = raw.listen.as_deref().unwrap_or("127.0.0.1:8080");
        let listen = listen.parse().map_err(|e| {
            invalid(
                "listen",
                format!("{listen:?} is not an address like 127.0.0.1:8080 ({e})"),
            )
        })?;
        let workers = match raw.workers {
            None => std::thread::available_parallelism().map_or(1, usize::from),
            Some(n @ 1..=MAX_WORKERS) => n,
            Some(n) => {
                return Err(invalid(
                    "workers",
                    format!("{n}: use 1 to {MAX_WORKERS} worker threads"),
                ))
            }
        };
        let store = raw.store.unwrap_or_else(|| "memory://".to_owned());
        let scheme = store.split("://").next().unwrap_or_default();
        if !store.contains("://")
            || !["memory", "redis", "rediss", "unix", "redis+unix"].contains(&scheme)
        {
            return Err(invalid(
                "store",
                format!("{store:?}: use memory://, redis://host:port[/db], rediss://... or unix:///path"),
            ));
        }
        let default_limit = raw.default_limit.unwrap_or(0);
        let max_limit = raw.max_limit.unwrap_or(0);
        let lease = duration("lease", raw.lease.as_deref(), Duration::from_secs(30))?;
        if lease < Duration::from_millis(100) || lease > Duration::from_secs(86_400) {
            return Err(invalid("lease", "must be between 100ms and 24h"));
        }
        let on_store_failure = match raw.on_store_failure.as_deref().unwrap_or("fail_closed") {
            "fail_closed" => FailurePolicy::FailClosed,
            "fail_open" => FailurePolicy::FailOpen,
            "fail_open_local" => match raw.fail_open_local_limit.unwrap_or(1) {
                0 => return Err(invalid("fail_open_local_limit", "must be at least 1")),
                limit => FailurePolicy::FailOpenLocal { limit },
            },
            other => {
                return Err(invalid(
                    "on_store_failure",
                    format!("{other:?}: use fail_closed, fail_open or fail_open_local"),
                ))
            }
        };
        let upstream = match raw.upstream {
            None => None,
            Some(url) => {
                let uri: http::Uri = url
                    .parse()
                    .map_err(|e| invalid("upstream", format!("{url:?}: {e}")))?;
                if uri.scheme_str() != Some("http") || uri.authority().is_none() {
                    return Err(invalid(
                        "upstream",
                        format!(
                            "{url:?}: use http://host:port (TLS to the upstream is not supported)"
                        ),
                    ));
                }
                Some(uri)
            }
        };
        let redis_ca_cert = match raw.redis_ca_cert {
            None => None,
            Some(path) if cfg!(feature = "tls") => Some(
                std::fs::read(&path)
                    .map_err(|e| invalid("redis_ca_cert", format!("{}: {e}", path.display())))?,
            ),
            Some(_) => {
                return Err(invalid(
                    "redis_ca_cert",
                    "this build has no TLS (build with --features tls)",
                ))
            }
        };
        if store.starts_with("rediss://") && !cfg!(feature = "tls") {
            return Err(invalid(
                "store",
                "rediss:// needs a build with TLS (--features tls)",
            ));
        }
        // One batch out at a time by default: behind an HTTP server, larger batches and fewer Redis calls
        // served more requests/s than the library's default of 3 (BENCHMARKS.md, "Redis pipeline").
        let redis_pipeline = raw.redis_pipeline.unwrap_or(1);
        if !(1..=64).contains(&redis_pipeline) {
            return Err(invalid("redis_pipeline", "must be between 1 and 64"));
        }
        let key_header = raw.key_header.as_deref().unwrap_or("X-Inflight-Key");
        let key_header = http::HeaderName::from_bytes(key_header.as_bytes())
            .map_err(|_| invalid("key_header", format!("{key_header:?} is not a header name")))?;
        Ok(Self {
            listen,
            workers,
            store,
            default_limit,
            max_limit,
            lease,
            admin_token: raw.admin_token.filter(|t| !t.is_empty()),
            on_store_failure,
            metrics_per_key: raw.metrics_per_key.unwrap_or(false),
            shutdown_grace: duration(
                "shutdown_grace",
                raw.shutdown_grace.as_deref(),
                Duration::from_secs(30),
            )?,
            redis_prefix: raw
                .redis_prefix
                .unwrap_or_else(|| inflight::store::DEFAULT_PREFIX.to_owned()),
            redis_ca_cert,
            redis_pipeline,
            upstream,
            key_header,
            upstream_timeout: duration(
                "upstream_timeout",
                raw.upstream_timeout.as_deref(),
                Duration::from_secs(60),
            )?,
        })
    }

    /// The store URL with any password masked, for logs.
    pub fn store_for_logs(&self) -> String {
        match (self.store.find("://"), self.store.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                format!("{}://***@{}", &self.store[..scheme], &self.store[at + 1..])
            }
            _ => self.store.clone(),
        }
    }
}

fn duration(
    setting: &str,
    value: Option<&str>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match value {
        None => Ok(default),
        Some(text) => humantime::parse_duration(text).map_err(|e| {
            invalid(
                setting,
                format!("{text:?} is not a duration like 30s or 500ms ({e})"),
            )
        }),
    }
}

/// The reference system's variables stand in for unset `INFLIGHT_*` ones, at the environment's rank.
fn with_dify_aliases(mut args: CommonArgs) -> Result<CommonArgs, ConfigError> {
    if args.default_limit.is_none() {
        args.default_limit = dify_alias("APP_DEFAULT_ACTIVE_REQUESTS")?;
    }
    if args.max_limit.is_none() {
        args.max_limit = dify_alias("APP_MAX_ACTIVE_REQUESTS")?;
    }
    Ok(args)
}

fn dify_alias(var: &str) -> Result<Option<u32>, ConfigError> {
    match std::env::var(var) {
        Err(_) => Ok(None),
        Ok(text) if text.trim().is_empty() => Ok(None),
        Ok(text) => text
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| invalid(var, format!("{text:?} is not a whole number >= 0"))),
    }
}
