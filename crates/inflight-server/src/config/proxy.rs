//! The settings of `inflight proxy`: the upstream, how a request's keys are formed, which paths are
//! limited; and `serve`'s settings.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};

use super::{invalid, text, ConfigError, Layered, Settings};

/// The settings of `inflight proxy`.
#[derive(Clone, Debug, Args, Serialize, Deserialize)]
#[command(next_help_heading = "Proxy")]
pub struct ProxySettings {
    /// The API to forward to, e.g. http://127.0.0.1:5001.
    #[arg(long, env = "INFLIGHT_UPSTREAM", value_name = "URL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// A key each request is admitted under (repeatable, up to 16, all taken at once or none): text with
    /// {header:NAME}, {bearer_hash} (16 hex digits of the SHA-256 of the bearer token), {path},
    /// {path_hash} (of the path, for one that carries a secret) or {client_ip} (the connection's address;
    /// with --trust-forwarded, X-Forwarded-For's last hop), e.g. 'tenant:{header:X-Tenant-Id}'. Commas
    /// separate templates (here and in INFLIGHT_KEY).
    #[arg(
        long,
        env = "INFLIGHT_KEY",
        value_name = "TEMPLATE",
        value_delimiter = ','
    )]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub key: Vec<String>,
    /// Shorthand for --key '{header:NAME}' [default: X-Inflight-Key, when no --key is given].
    #[arg(long, env = "INFLIGHT_KEY_HEADER", value_name = "NAME")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_header: Option<String>,
    /// A request whose keys cannot be formed (a header missing or empty, no bearer token): reject (400
    /// missing_key) or pass (forwarded without a limit). A duplicated header is always 400 invalid_key.
    #[arg(long, env = "INFLIGHT_ON_MISSING_KEY", value_name = "POLICY")]
    #[arg(default_value = "reject")]
    pub on_missing_key: String,
    /// Limit only requests under this path prefix, by whole segments (repeatable; default: all requests).
    /// Paths are matched decoded, case-insensitively, with `//` collapsed; ones with `.` or `..` segments
    /// are refused (400).
    #[arg(
        long,
        env = "INFLIGHT_LIMIT_PATH",
        value_name = "PREFIX",
        value_delimiter = ','
    )]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limit_path: Vec<String>,
    /// Keep the clients' X-Forwarded-For, Forwarded and X-Real-IP and append to X-Forwarded-For, as
    /// behind a load balancer of one's own; by default they are replaced by the address the proxy saw.
    /// Templates' {client_ip} is then X-Forwarded-For's last hop, the address the balancer saw.
    #[arg(long, env = "INFLIGHT_TRUST_FORWARDED")]
    #[arg(action = clap::ArgAction::SetTrue)]
    pub trust_forwarded: bool,
    /// Send each admitted request's fencing token upstream in `Inflight-Token` (a client's own is
    /// removed), so that the upstream can refuse a holder whose lease lapsed: one with a smaller token
    /// than one it has seen on the key.
    #[arg(long, env = "INFLIGHT_FORWARD_TOKEN")]
    #[arg(action = clap::ArgAction::SetTrue)]
    pub forward_token: bool,
    /// Where the API (permits, limits, metrics) answers, apart from the proxied port, so that proxied
    /// clients cannot reach it.
    #[arg(help_heading = "Admin")]
    #[arg(long, env = "INFLIGHT_ADMIN_LISTEN", value_name = "ADDR")]
    #[arg(default_value = "127.0.0.1:9090")]
    pub admin_listen: SocketAddr,
    /// Answer the API on the proxied port too, under /_inflight/, instead of on --admin-listen: any
    /// proxied client can then use it (a warning says so at start).
    #[arg(help_heading = "Admin")]
    #[arg(long, env = "INFLIGHT_ADMIN_ON_PROXY_PORT")]
    #[arg(action = clap::ArgAction::SetTrue)]
    pub admin_on_proxy_port: bool,
    /// The key whose balance each limited request is charged 1, a template like --key's (e.g.
    /// 'tenant:{header:X-Tenant-Id}'): reserved before the admission (429 quota_exhausted when the
    /// balance is spent), committed when the upstream answered below 500 and the response body was sent
    /// to the end, refunded otherwise. A key with no balance set is not charged.
    #[arg(help_heading = "Quotas")]
    #[arg(long, env = "INFLIGHT_QUOTA_KEY", value_name = "TEMPLATE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota_key: Option<String>,
    /// How long a request may take upstream until its response headers: connecting, sending it, waiting.
    #[arg(long, env = "INFLIGHT_UPSTREAM_TIMEOUT", value_name = "DURATION")]
    #[arg(default_value = "60s", value_parser = text::parse)]
    #[serde(with = "text")]
    pub upstream_timeout: Duration,
    /// How long a limited request may wait for a slot before it is refused with 429 (0s: at once, as
    /// without waiting; at most 5m). A client that goes away while waiting leaves the queue.
    #[arg(long, env = "INFLIGHT_MAX_WAIT", value_name = "DURATION")]
    #[arg(default_value = "0s", value_parser = text::parse)]
    #[serde(with = "text")]
    pub max_wait: Duration,
    /// The priority level a waiting request (--max-wait) queues at, higher first: a template like
    /// --key's giving a whole number 0 to 255, e.g. '{header:X-Priority}'. Any other value is refused
    /// (400 invalid_priority), on every request; where the template's placeholder has nothing in the
    /// request (a header absent or empty), the level is 0.
    #[arg(long, env = "INFLIGHT_PRIORITY", value_name = "TEMPLATE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
    /// The flow a waiting request (--max-wait) queues in: within a priority level, flows take turns, so
    /// one tenant's many waiters do not keep another's few behind them. A template like --key's, e.g.
    /// '{header:X-Tenant-Id}' or '{bearer_hash}'; at most 256 bytes (else 400 invalid_flow, on every
    /// request); where its placeholder has nothing in the request, the default flow.
    #[arg(long, env = "INFLIGHT_FLOW", value_name = "TEMPLATE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flow: Option<String>,
    /// A label each limited request's permit is listed with (GET /v1/keys/{key}/permits), so that an
    /// operator can tell holders apart and revoke one: a template like --key's, e.g. '{client_ip}' or
    /// 'user:{header:X-User-Id}'. At most 128 bytes (else 400 invalid_holder); where its placeholder has
    /// nothing in the request, no label. A labelled permit always takes a lease, on the memory store too.
    #[arg(long, env = "INFLIGHT_HOLDER", value_name = "TEMPLATE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// A response whose permit is revoked (or its lease lost) while it runs: end (its body is cut short
    /// at once, counted in inflight_proxy_streams_revoked_total; still waiting for the upstream's
    /// headers: 409 revoked) or finish (it runs to its end, its slot free already).
    #[arg(long, env = "INFLIGHT_ON_REVOKE", value_name = "POLICY")]
    #[arg(default_value = "end")]
    pub on_revoke: String,
    /// The settings `inflight serve` has.
    #[command(flatten)]
    #[serde(flatten)]
    pub serve: Settings,
}

/// An upstream is required.
impl Layered for ProxySettings {
    fn file(&self) -> Option<&Path> {
        self.serve.config.as_deref()
    }

    fn check(&self) -> Result<(), ConfigError> {
        self.serve.check()?;
        if self.max_wait > crate::api::MAX_WAIT {
            return Err(invalid("max_wait", "must be at most 5m"));
        }
        self.upstream()?;
        self.keys()?;
        self.on_missing_key()?;
        self.quota_key()?;
        self.queue()?;
        self.holder()?;
        self.on_revoke()?;
        self.limit_paths().map(drop)
    }
}

impl ProxySettings {
    /// The upstream's base URL: `http://host[:port][/base]`.
    pub fn upstream(&self) -> Result<http::Uri, ConfigError> {
        let Some(url) = &self.upstream else {
            let reason = "`inflight proxy` needs --upstream URL (or INFLIGHT_UPSTREAM)";
            return Err(invalid("upstream", reason));
        };
        let uri: http::Uri = url
            .parse()
            .map_err(|e| invalid("upstream", format!("{url:?}: {e}")))?;
        if uri.scheme_str() != Some("http") || uri.authority().is_none() {
            let reason =
                format!("{url:?}: use http://host:port (TLS to the upstream is not supported)");
            return Err(invalid("upstream", reason));
        }
        Ok(uri)
    }

    /// The key templates: --key-header's, then --key's; with neither, the X-Inflight-Key header's.
    pub fn keys(&self) -> Result<crate::proxy::KeyTemplates, ConfigError> {
        let name = self.key_header.as_deref().unwrap_or("X-Inflight-Key");
        let header = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| invalid("key_header", format!("{name:?} is not a header name")))?;
        if self.key.is_empty() {
            return Ok(crate::proxy::KeyTemplates::header(header));
        }
        let shorthand = self
            .key_header
            .as_ref()
            .map(|_| format!("{{header:{header}}}"));
        let all = shorthand.iter().chain(&self.key).map(String::as_str);
        crate::proxy::KeyTemplates::parse(all).map_err(|why| invalid("key", why))
    }

    /// The template of the key each limited request is charged to, if any.
    pub fn quota_key(&self) -> Result<Option<crate::proxy::KeyTemplates>, ConfigError> {
        self.quota_key
            .as_deref()
            .map(|template| crate::proxy::KeyTemplates::parse([template]))
            .transpose()
            .map_err(|why| invalid("quota_key", why))
    }

    /// The templates of the priority and the flow each request waits with, where set.
    pub fn queue(&self) -> Result<crate::proxy::StandingTemplates, ConfigError> {
        let mut queue = crate::proxy::StandingTemplates::default().levels(&self.serve.priorities);
        if let Some(template) = &self.priority {
            queue = queue
                .priority(template)
                .map_err(|why| invalid("priority", why))?;
        }
        if let Some(template) = &self.flow {
            queue = queue.flow(template).map_err(|why| invalid("flow", why))?;
        }
        Ok(queue)
    }

    /// The template of the label each limited request's permit is listed with, if set.
    pub fn holder(&self) -> Result<crate::proxy::HolderTemplate, ConfigError> {
        match &self.holder {
            Some(template) => {
                crate::proxy::HolderTemplate::parse(template).map_err(|why| invalid("holder", why))
            }
            None => Ok(crate::proxy::HolderTemplate::default()),
        }
    }

    /// What becomes of a response whose permit is revoked while it runs.
    pub fn on_revoke(&self) -> Result<crate::proxy::OnRevoke, ConfigError> {
        match self.on_revoke.as_str() {
            "end" => Ok(crate::proxy::OnRevoke::End),
            "finish" => Ok(crate::proxy::OnRevoke::Finish),
            other => Err(invalid(
                "on_revoke",
                format!("{other:?}: use end or finish"),
            )),
        }
    }

    /// What becomes of a request whose keys cannot be formed.
    pub fn on_missing_key(&self) -> Result<crate::proxy::OnMissingKey, ConfigError> {
        match self.on_missing_key.as_str() {
            "reject" => Ok(crate::proxy::OnMissingKey::Reject),
            "pass" => Ok(crate::proxy::OnMissingKey::Pass),
            other => Err(invalid(
                "on_missing_key",
                format!("{other:?}: use reject or pass"),
            )),
        }
    }

    /// The path prefixes whose requests are limited.
    pub fn limit_paths(&self) -> Result<crate::proxy::LimitPaths, ConfigError> {
        crate::proxy::LimitPaths::parse(self.limit_path.iter().map(String::as_str))
            .map_err(|why| invalid("limit_path", why))
    }
}
