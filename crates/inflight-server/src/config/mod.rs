//! Settings: flags > environment > TOML file > defaults, each bad value named by its setting.
//!
//! Each setting is a field below: its flag, its `INFLIGHT_*` variable, its TOML key, its type, its default
//! and its help all come from there. When `INFLIGHT_DEFAULT_LIMIT` / `INFLIGHT_MAX_LIMIT` are unset, the
//! reference system's `APP_DEFAULT_ACTIVE_REQUESTS` / `APP_MAX_ACTIVE_REQUESTS` are honoured, so an existing
//! Dify deployment's settings carry over.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, FromArgMatches, Parser, Subcommand};
use figment::providers::{Format, Serialized, Toml};
use figment::value::{Dict, Value};
use figment::Figment;
use inflight::{ClassLimits, FailurePolicy, Policy};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub use inflight::MAX_LEASE;
pub use proxy::ProxySettings;

mod proxy;

/// The most worker threads a server runs.
const MAX_WORKERS: usize = 1024;

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
    Serve(Settings),
    /// A reverse proxy that enforces the limits in front of an upstream API (and answers the API under
    /// /_inflight/).
    Proxy(ProxySettings),
    /// Drives the library directly (no HTTP) and prints one JSON line of throughput and latency.
    Bench(crate::bench::BenchArgs),
}

/// The settings of `inflight serve`, which `inflight proxy` has too.
#[derive(Clone, Debug, Args, Serialize, Deserialize)]
pub struct Settings {
    /// Address to listen on.
    #[arg(long, env = "INFLIGHT_LISTEN", value_name = "ADDR")]
    #[arg(default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Worker threads serving connections, each with its own runtime, limiter and listening socket
    /// [default: one per CPU core].
    #[arg(long, env = "INFLIGHT_WORKERS", value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers: Option<usize>,
    /// Where leases live: memory:// (embedded), redis://host:port[/db], rediss://..., unix:///path,
    /// redis+cluster://host:port,host:port (Redis Cluster), redis+sentinel://host:port,host:port/name
    /// (the primary Sentinel names); rediss+cluster:// and rediss+sentinel:// for TLS.
    #[arg(long, env = "INFLIGHT_STORE", value_name = "URL")]
    #[arg(default_value = "memory://")]
    pub store: String,
    /// Limit of a key without an override; 0 = unlimited (env fallback APP_DEFAULT_ACTIVE_REQUESTS).
    #[arg(long, env = "INFLIGHT_DEFAULT_LIMIT", value_name = "N")]
    #[arg(default_value_t = 0)]
    pub default_limit: u32,
    /// Ceiling over every key's limit; 0 = none (env fallback APP_MAX_ACTIVE_REQUESTS).
    #[arg(long, env = "INFLIGHT_MAX_LIMIT", value_name = "N")]
    #[arg(default_value_t = 0)]
    pub max_limit: u32,
    /// The most keys that may have an override at once (0: no bound); one more is 409
    /// too_many_overrides. Overrides never expire, so this bounds what setting them can fill.
    #[arg(long, env = "INFLIGHT_MAX_OVERRIDES", value_name = "N")]
    #[arg(default_value_t = 100_000)]
    pub max_overrides: usize,
    /// The limits of a class of keys, repeatable: PATTERN=DEFAULT[,max=N], e.g. 'tenant:*=50,max=200'
    /// (`*` matches any run of characters; the rule with the longest literal prefix wins; keys matching
    /// none have --default-limit and --max-limit). In the file: [[limits]] keys = "tenant:*", default = 50,
    /// max = 200. Several in the variable: separated by `;`. SIGHUP re-reads them.
    #[arg(long = "limit", env = "INFLIGHT_LIMITS", value_name = "RULE")]
    #[arg(value_parser = LimitRule::parse, value_delimiter = ';')]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<LimitRule>,
    /// Lease of a permit unless its request asks for another, e.g. 30s, 500ms.
    #[arg(long, env = "INFLIGHT_LEASE", value_name = "DURATION")]
    #[arg(default_value = "30s", value_parser = text::parse)]
    #[serde(with = "text")]
    pub lease: Duration,
    /// Bearer token that changing limits requires (unset: no token needed). A flag shows in the process
    /// list: prefer INFLIGHT_ADMIN_TOKEN or --admin-token-file.
    #[arg(long, env = "INFLIGHT_ADMIN_TOKEN", value_name = "TOKEN")]
    #[arg(hide_env_values = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_token: Option<String>,
    /// A file holding the admin token (its first line), instead of --admin-token.
    #[arg(long, env = "INFLIGHT_ADMIN_TOKEN_FILE", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_token_file: Option<PathBuf>,
    /// Bearer token that every /v1 route requires, permits included (unset: none); the admin token
    /// also passes. A flag shows in the process list: prefer INFLIGHT_API_TOKEN.
    #[arg(long, env = "INFLIGHT_API_TOKEN", value_name = "TOKEN")]
    #[arg(hide_env_values = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_token: Option<String>,
    /// When the store is unreachable: fail_closed (503), fail_open (admit), fail_open_local (admit under a
    /// per-process cap).
    #[arg(long, env = "INFLIGHT_ON_STORE_FAILURE", value_name = "POLICY")]
    #[arg(default_value = "fail_closed")]
    pub on_store_failure: String,
    /// The per-process, per-key cap under fail_open_local.
    #[arg(long, env = "INFLIGHT_FAIL_OPEN_LOCAL_LIMIT", value_name = "N")]
    #[arg(default_value_t = 1)]
    pub fail_open_local_limit: u32,
    /// Label metrics with each key (high cardinality: only with few keys).
    #[arg(long, env = "INFLIGHT_METRICS_PER_KEY", value_name = "BOOL")]
    #[arg(default_value_t = false, action = clap::ArgAction::Set)]
    pub metrics_per_key: bool,
    /// How long a client may take to send a request's headers before its connection is closed.
    #[arg(long, env = "INFLIGHT_HEADER_TIMEOUT", value_name = "DURATION")]
    #[arg(default_value = "10s", value_parser = text::parse)]
    #[serde(with = "text")]
    pub header_timeout: Duration,
    /// How long, after SIGTERM or Ctrl-C, running responses may finish.
    #[arg(long, env = "INFLIGHT_SHUTDOWN_GRACE", value_name = "DURATION")]
    #[arg(default_value = "30s", value_parser = text::parse)]
    #[serde(with = "text")]
    pub shutdown_grace: Duration,
    /// Prefix of every Redis key.
    #[arg(long, env = "INFLIGHT_REDIS_PREFIX", value_name = "PREFIX")]
    #[arg(default_value = inflight::store::DEFAULT_PREFIX)]
    pub redis_prefix: String,
    /// For rediss:// stores signed by a private CA: its certificate (PEM file). Needs the `tls` feature.
    #[arg(long, env = "INFLIGHT_REDIS_CA_CERT", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_ca_cert: Option<PathBuf>,
    /// Batches of admissions and releases out to Redis at once from each worker, 1 to 64: fewer makes
    /// batches larger and Redis calls fewer.
    #[arg(long, env = "INFLIGHT_REDIS_PIPELINE", value_name = "N")]
    #[arg(default_value_t = 1)]
    pub redis_pipeline: usize,
    /// Replicas that must acknowledge each batch of admissions (Redis WAIT) before it is answered, so a
    /// failover loses fewer of them (0: none); see RELIABILITY.md, "Failover".
    #[arg(long, env = "INFLIGHT_REDIS_WAIT_REPLICAS", value_name = "N")]
    #[arg(default_value_t = 0)]
    pub redis_wait_replicas: u32,
    /// How long an admission waits for those replicas at most; then it is answered anyway.
    #[arg(long, env = "INFLIGHT_REDIS_WAIT_TIMEOUT", value_name = "DURATION")]
    #[arg(default_value = "100ms", value_parser = text::parse)]
    #[serde(with = "text")]
    pub redis_wait_timeout: Duration,
    /// A TOML file with any of these settings (flags and environment win over it).
    #[arg(long, env = "INFLIGHT_CONFIG", value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
}

/// The limits of one class of keys: `[[limits]]` in the file, `--limit` as a flag.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitRule {
    /// The keys of the class: a glob pattern, `*` matching any run of characters.
    pub keys: String,
    /// The limit of a key of the class without an override; 0 = unlimited.
    #[serde(default)]
    pub default: u32,
    /// The ceiling over every key of the class, overrides included; 0 = none.
    #[serde(default)]
    pub max: u32,
}

impl LimitRule {
    /// `PATTERN=DEFAULT[,max=N]` (also `PATTERN=default=N,max=N`, or `PATTERN=max=N`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let usage = || format!("{text:?}: use PATTERN=DEFAULT[,max=N], e.g. 'tenant:*=50,max=200'");
        let (keys, terms) = text.split_once('=').ok_or_else(usage)?;
        let mut rule = LimitRule {
            keys: keys.trim().to_owned(),
            default: 0,
            max: 0,
        };
        for (i, term) in terms.split(',').enumerate() {
            let (name, value) = match term.split_once('=') {
                Some((name, value)) => (name.trim(), value),
                None if i == 0 => ("default", term),
                None => return Err(usage()),
            };
            let value = value.trim().parse().map_err(|_| usage())?;
            match name {
                "default" => rule.default = value,
                "max" => rule.max = value,
                _ => return Err(usage()),
            }
        }
        Ok(rule)
    }
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

fn invalid(setting: &str, reason: impl std::fmt::Display) -> ConfigError {
    ConfigError {
        setting: setting.to_owned(),
        reason: reason.to_string(),
    }
}

/// A command's settings: parsed from flags and the environment, layered over the TOML file, checked.
pub trait Layered: Args + FromArgMatches + Serialize + DeserializeOwned {
    /// The TOML file the settings name, if any.
    fn file(&self) -> Option<&Path>;

    /// Checks the values, naming the setting of a bad one.
    fn check(&self) -> Result<(), ConfigError>;

    /// These settings (as parsed into `matches`) over the file's, checked.
    fn layered(&self, matches: &ArgMatches) -> Result<Self, ConfigError> {
        let settings = layer(self, matches, self.file())?;
        settings.check()?;
        Ok(settings)
    }

    /// The settings of `flags` (the first is the program's name) and the environment, layered and checked.
    fn from_flags<I, T>(flags: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let matches = Self::augment_args(clap::Command::new("inflight"))
            .try_get_matches_from(flags)
            .map_err(|e| invalid("flags", e))?;
        let args = Self::from_arg_matches(&matches).map_err(|e| invalid("flags", e))?;
        args.layered(&matches)
    }
}

impl Layered for Settings {
    fn file(&self) -> Option<&Path> {
        self.config.as_deref()
    }

    fn check(&self) -> Result<(), ConfigError> {
        if let Some(n) = self.workers.filter(|n| !(1..=MAX_WORKERS).contains(n)) {
            let reason = format!("{n}: use 1 to {MAX_WORKERS} worker threads");
            return Err(invalid("workers", reason));
        }
        let scheme = self.store.split("://").next().unwrap_or_default();
        if !self.store.contains("://")
            || ![
                "memory",
                "redis",
                "rediss",
                "unix",
                "redis+unix",
                "redis+cluster",
                "rediss+cluster",
                "redis+sentinel",
                "rediss+sentinel",
            ]
            .contains(&scheme)
        {
            let reason = format!(
                "{:?}: use memory://, redis://host:port[/db], rediss://..., unix:///path, \
                 redis+cluster://host:port,... or redis+sentinel://host:port,.../name",
                self.store
            );
            return Err(invalid("store", reason));
        }
        if scheme.starts_with("rediss") && !cfg!(feature = "tls") {
            let reason = "rediss:// needs a build with TLS (--features tls)";
            return Err(invalid("store", reason));
        }
        if self.redis_ca_cert.is_some() && !cfg!(feature = "tls") {
            let reason = "this build has no TLS (build with --features tls)";
            return Err(invalid("redis_ca_cert", reason));
        }
        if self.lease < Duration::from_millis(100) || self.lease > MAX_LEASE {
            return Err(invalid("lease", "must be between 100ms and 24h"));
        }
        if self.header_timeout < Duration::from_millis(10) || self.header_timeout > MAX_LEASE {
            return Err(invalid("header_timeout", "must be between 10ms and 24h"));
        }
        if !(1..=64).contains(&self.redis_pipeline) {
            return Err(invalid("redis_pipeline", "must be between 1 and 64"));
        }
        if self.redis_wait_replicas > 0
            && !(Duration::from_millis(1)..=Duration::from_secs(10))
                .contains(&self.redis_wait_timeout)
        {
            return Err(invalid("redis_wait_timeout", "must be between 1ms and 10s"));
        }
        self.policy()?;
        self.admin_token()?;
        self.failure_policy().map(drop)
    }
}

impl Settings {
    /// How many worker threads serve connections.
    pub fn workers(&self) -> usize {
        self.workers
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
    }

    /// The admin token, from `admin_token` or the first line of `admin_token_file` (not both).
    pub fn admin_token(&self) -> Result<Option<String>, ConfigError> {
        let given = self.admin_token.clone().filter(|t| !t.is_empty());
        let Some(path) = &self.admin_token_file else {
            return Ok(given);
        };
        if given.is_some() {
            return Err(invalid(
                "admin_token_file",
                "give the admin token or its file, not both",
            ));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| invalid("admin_token_file", format!("{}: {e}", path.display())))?;
        match text.lines().next().map(str::trim) {
            Some(token) if !token.is_empty() => Ok(Some(token.to_owned())),
            _ => Err(invalid(
                "admin_token_file",
                format!("{} is empty", path.display()),
            )),
        }
    }

    /// The limits: the rules of `limits` over the default and the ceiling.
    pub fn policy(&self) -> Result<Policy, ConfigError> {
        let mut policy = Policy::new(self.default_limit, self.max_limit);
        for rule in &self.limits {
            let limits = ClassLimits::new(rule.default, rule.max);
            policy = policy
                .rule(&rule.keys, limits)
                .map_err(|e| invalid("limits", e))?;
        }
        Ok(policy)
    }

    /// What to do when the store is unreachable.
    pub fn failure_policy(&self) -> Result<FailurePolicy, ConfigError> {
        match self.on_store_failure.as_str() {
            "fail_closed" => Ok(FailurePolicy::FailClosed),
            "fail_open" => Ok(FailurePolicy::FailOpen),
            "fail_open_local" => match self.fail_open_local_limit {
                0 => Err(invalid("fail_open_local_limit", "must be at least 1")),
                limit => Ok(FailurePolicy::FailOpenLocal { limit }),
            },
            other => Err(invalid(
                "on_store_failure",
                format!("{other:?}: use fail_closed, fail_open or fail_open_local"),
            )),
        }
    }

    /// The CA certificate (PEM) that a rediss:// store's certificate is checked against, if not the web's.
    pub fn redis_ca_cert(&self) -> Result<Option<Vec<u8>>, ConfigError> {
        let Some(path) = &self.redis_ca_cert else {
            return Ok(None);
        };
        std::fs::read(path)
            .map(Some)
            .map_err(|e| invalid("redis_ca_cert", format!("{}: {e}", path.display())))
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

/// `args` as parsed, with the file (if any) over the defaults and under the flags and the environment.
fn layer<A: Serialize + DeserializeOwned>(
    args: &A,
    matches: &ArgMatches,
    file: Option<&Path>,
) -> Result<A, ConfigError> {
    let Ok(Value::Dict(_, parsed)) = Value::serialize(args) else {
        unreachable!("settings serialize to a dictionary");
    };
    let mut explicit: Dict = parsed
        .iter()
        .filter(|(id, _)| {
            matches!(
                matches.value_source(id),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        })
        .map(|(id, value)| (id.clone(), value.clone()))
        .collect();
    // The reference system's variables stand in for unset `INFLIGHT_*` ones, at the environment's rank.
    for (id, var) in [
        ("default_limit", "APP_DEFAULT_ACTIVE_REQUESTS"),
        ("max_limit", "APP_MAX_ACTIVE_REQUESTS"),
    ] {
        if !explicit.contains_key(id) {
            if let Some(limit) = dify_alias(var)? {
                explicit.insert(id.to_owned(), limit.into());
            }
        }
    }
    let mut figment = Figment::from(Serialized::defaults(parsed));
    if let Some(path) = file {
        if !path.exists() {
            return Err(invalid(
                "config",
                format!("{} does not exist", path.display()),
            ));
        }
        check_keys(path)?;
        figment = figment.merge(Toml::file(path));
    }
    let figment = figment.merge(Serialized::defaults(explicit));
    figment.extract().map_err(|e| {
        // The proxy's settings flatten serve's, whose errors then come without their path: ask again
        // for serve's alone, which names the setting.
        let e = match (e.path.is_empty(), figment.extract::<Settings>()) {
            (true, Err(named)) => named,
            _ => e,
        };
        let setting = e.path.last().map_or("config", String::as_str);
        invalid(setting, e.kind)
    })
}

/// Refuses a key of the file that is no setting of any command (a misspelt one, say).
fn check_keys(path: &Path) -> Result<(), ConfigError> {
    let keys: Dict = Figment::from(Toml::file(path))
        .extract()
        .map_err(|e| invalid("config", e))?;
    let command = ProxySettings::augment_args(clap::Command::new("inflight"));
    let known: Vec<&str> = command
        .get_arguments()
        .map(|a| a.get_id().as_str())
        .collect();
    match keys
        .keys()
        .find(|key| key.as_str() == "config" || !known.contains(&key.as_str()))
    {
        Some(key) => Err(invalid(key, "no such setting")),
        None => Ok(()),
    }
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

/// Durations as text (`30s`, `500ms`), as flags, variables and the file give them.
mod text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(value: &Duration, to: S) -> Result<S::Ok, S::Error> {
        to.collect_str(&humantime::format_duration(*value))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(from: D) -> Result<Duration, D::Error> {
        parse(&String::deserialize(from)?).map_err(serde::de::Error::custom)
    }

    /// A duration like 30s or 500ms.
    pub(super) fn parse(text: &str) -> Result<Duration, String> {
        humantime::parse_duration(text)
            .map_err(|e| format!("{text:?} is not a duration like 30s or 500ms ({e})"))
    }
}
