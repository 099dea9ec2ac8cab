//! The settings of `inflight serve` (which `inflight proxy` has too): each a field, with its flag, its
//! variable, its TOML key, its default and its help; their checks; and what they make (the limits, the
//! failure policy, the admin token).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use inflight::{ClassLimits, FailurePolicy, Floors, Policy};
use serde::{Deserialize, Serialize};

use super::{
    invalid, store, text, ConfigError, Connections, Layered, Layout, LimitRule, LoggingSettings,
    Mode, QuotaSettings, RedisSettings, TlsSettings, MAX_LEASE, MIN_LEASE,
};

/// The most worker threads a server runs.
const MAX_WORKERS: usize = 1024;

/// The settings of `inflight serve`, which `inflight proxy` has too.
#[derive(Clone, Debug, Args, Serialize, Deserialize)]
#[command(next_help_heading = "Limits")]
pub struct Settings {
    /// Address to listen on.
    #[arg(help_heading = "Listening")]
    #[arg(long, env = "INFLIGHT_LISTEN", value_name = "ADDR")]
    #[arg(default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Worker threads serving connections, each with its own runtime, limiter and listening socket
    /// [default: one per CPU core].
    #[arg(help_heading = "Listening")]
    #[arg(long, env = "INFLIGHT_WORKERS", value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers: Option<usize>,
    /// Where leases live: memory:// (embedded), redis://host:port[/db], rediss://..., unix:///path,
    /// redis+cluster://host:port,host:port (Redis Cluster), redis+sentinel://host:port,host:port/name
    /// (the primary Sentinel names); rediss+cluster:// and rediss+sentinel:// for TLS.
    /// Unset, Dify's REDIS_HOST, REDIS_PORT, ... variables (REDIS_USE_SENTINEL, REDIS_USE_CLUSTERS) name
    /// the store when they are set.
    #[arg(help_heading = "Store")]
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
    /// none have --default-limit and --max-limit); ',floor=PRIORITY:SLOTS' after them keeps SLOTS of
    /// each key for waiters and holders at PRIORITY. In the file: `[[limits]]` keys = "tenant:*",
    /// default = 50, max = 200, floors = [{ priority = 9, slots = 4 }]. Several in the variable:
    /// separated by `;`. SIGHUP re-reads them.
    #[arg(long = "limit", env = "INFLIGHT_LIMITS", value_name = "RULE")]
    #[arg(value_parser = LimitRule::parse, value_delimiter = ';')]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<LimitRule>,
    /// The most admissions that may wait for a slot on one key at once, per worker (`wait_ms`, the
    /// proxy's --max-wait); one more is refused at once.
    #[arg(long, env = "INFLIGHT_MAX_WAITERS", value_name = "N")]
    #[arg(default_value_t = inflight::DEFAULT_MAX_WAITERS)]
    pub max_waiters: usize,
    /// The priority levels an admission may wait at (`"priority"` in acquire bodies, the proxy's
    /// --priority), e.g. 0,5,9 [default: any from 0 to 255]; another is refused 400
    /// invalid_priority. Each level with a floor (`floor=` in --limit) must be one of them.
    #[arg(
        long,
        env = "INFLIGHT_PRIORITIES",
        value_name = "LEVELS",
        value_delimiter = ','
    )]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub priorities: Vec<u8>,
    /// Lease of a permit unless its request asks for another, e.g. 30s, 500ms.
    #[arg(long, env = "INFLIGHT_LEASE", value_name = "DURATION")]
    #[arg(default_value = "30s", value_parser = text::parse)]
    #[serde(with = "text")]
    pub lease: Duration,
    /// Refuse (409 override_not_allowed) an override of a key that matches no --limit class, so that
    /// overrides are set only on the classes of keys that the operator has named.
    #[arg(long, env = "INFLIGHT_OVERRIDES_FOR_CLASSES_ONLY")]
    #[arg(action = clap::ArgAction::SetTrue)]
    pub overrides_for_classes_only: bool,
    /// Bearer token that changing limits requires (unset: no token needed). A flag shows in the process
    /// list: prefer INFLIGHT_ADMIN_TOKEN or --admin-token-file.
    #[arg(help_heading = "Admin")]
    #[arg(long, env = "INFLIGHT_ADMIN_TOKEN", value_name = "TOKEN")]
    #[arg(hide_env_values = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_token: Option<String>,
    /// A file holding the admin token (its first line), instead of --admin-token.
    #[arg(help_heading = "Admin")]
    #[arg(long, env = "INFLIGHT_ADMIN_TOKEN_FILE", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_token_file: Option<PathBuf>,
    /// Bearer token that every /v1 route requires, permits included (unset: none); the admin token
    /// also passes. A flag shows in the process list: prefer INFLIGHT_API_TOKEN.
    #[arg(help_heading = "Admin")]
    #[arg(long, env = "INFLIGHT_API_TOKEN", value_name = "TOKEN")]
    #[arg(hide_env_values = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_token: Option<String>,
    /// When the store is unreachable: fail_closed (503), fail_open (admit), fail_open_local (admit under a
    /// per-process cap).
    #[arg(help_heading = "Store")]
    #[arg(long, env = "INFLIGHT_ON_STORE_FAILURE", value_name = "POLICY")]
    #[arg(default_value = "fail_closed")]
    pub on_store_failure: String,
    /// The per-process, per-key cap under fail_open_local.
    #[arg(help_heading = "Store")]
    #[arg(long, env = "INFLIGHT_FAIL_OPEN_LOCAL_LIMIT", value_name = "N")]
    #[arg(default_value_t = 1)]
    pub fail_open_local_limit: u32,
    /// Label metrics with each key (high cardinality: only with few keys).
    #[arg(help_heading = "Logging and metrics")]
    #[arg(long, env = "INFLIGHT_METRICS_PER_KEY", value_name = "BOOL")]
    #[arg(default_value_t = false, action = clap::ArgAction::Set)]
    pub metrics_per_key: bool,
    /// Export the balances of quotas per class of keys (inflight_quota_balance{class}, ..._reserved): the
    /// sum of the last balance this process was answered for each key of the class, for up to 10,000
    /// keys.
    #[arg(help_heading = "Logging and metrics")]
    #[arg(long, env = "INFLIGHT_METRICS_BALANCES", value_name = "BOOL")]
    #[arg(default_value_t = false, action = clap::ArgAction::Set)]
    pub metrics_balances: bool,
    /// How long, after SIGTERM or Ctrl-C, running responses may finish.
    #[arg(help_heading = "Listening")]
    #[arg(long, env = "INFLIGHT_SHUTDOWN_GRACE", value_name = "DURATION")]
    #[arg(default_value = "30s", value_parser = text::parse)]
    #[serde(with = "text")]
    pub shutdown_grace: Duration,
    /// The Redis store's own settings.
    #[command(flatten)]
    #[serde(flatten)]
    pub redis: RedisSettings,
    /// How long clients may take, and how many connections they may hold.
    #[command(flatten)]
    #[serde(flatten)]
    pub connections: Connections,
    /// The settings of quotas.
    #[command(flatten)]
    #[serde(flatten)]
    pub quota: QuotaSettings,
    /// The settings of the log.
    #[command(flatten)]
    #[serde(flatten)]
    pub logging: LoggingSettings,
    /// TLS on the served port.
    #[command(flatten)]
    #[serde(flatten)]
    pub tls: TlsSettings,
    /// A TOML file with any of these settings (flags and environment win over it).
    #[arg(help_heading = "Config file")]
    #[arg(long, env = "INFLIGHT_CONFIG", value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
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
        let scheme = self.store_scheme();
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
        if self.lease < MIN_LEASE || self.lease > MAX_LEASE {
            return Err(invalid("lease", "must be between 100ms and 24h"));
        }
        let mut floored = self.limits.iter().flat_map(|rule| &rule.floors);
        if let Some(floor) = floored
            .find(|floor| !self.priorities.is_empty() && !self.priorities.contains(&floor.priority))
        {
            let reason = format!(
                "{}: a floor's level must be one of them (a floor is set for it in `limits`)",
                floor.priority
            );
            return Err(invalid("priorities", reason));
        }
        if self.redis.layout == Layout::Dify && self.default_limit == 0 && self.max_limit == 0 {
            // Dify's limit key is absent until a Dify worker serves the app, and a day after the last
            // one did: the default (else the ceiling, as dify.lua resolves it) is then the only limit.
            let reason = "--layout dify needs a default limit or a ceiling above 0 (Dify's \
                          APP_DEFAULT_ACTIVE_REQUESTS or APP_MAX_ACTIVE_REQUESTS): it is the limit of an \
                          app whose limit Dify has not written to Redis";
            return Err(invalid("default_limit", reason));
        }
        self.connections.check()?;
        self.redis.check()?;
        self.quota.check()?;
        self.logging.check()?;
        self.tls.check()?;
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
            if !rule.floors.is_empty() {
                let levels: Vec<(u8, u32)> = rule
                    .floors
                    .iter()
                    .map(|floor| (floor.priority, floor.slots))
                    .collect();
                let floors = Floors::new(&levels).map_err(|e| invalid("limits", e))?;
                policy = policy
                    .floors(Some(&rule.keys), floors)
                    .map_err(|e| invalid("limits", e))?;
            }
            if rule.mode == Mode::Shadow {
                policy = policy
                    .shadow(&rule.keys, true)
                    .map_err(|e| invalid("limits", e))?;
            }
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

    /// The scheme of the store URL (`redis+cluster`, say).
    pub(crate) fn store_scheme(&self) -> &str {
        self.store.split("://").next().unwrap_or_default()
    }

    /// Where the store URL came from, for the start-up line.
    pub fn store_source(&self) -> &'static str {
        let dify = store::dify_store_url(|name| std::env::var(name).ok());
        if dify.ok().flatten().as_deref() == Some(self.store.as_str()) {
            "Dify's REDIS_* variables"
        } else {
            "store"
        }
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
