//! The Redis store's own settings, and the store URL that Dify's `REDIS_*` variables stand in for.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::{Deserialize, Serialize};

use super::{invalid, text, ConfigError};

/// The settings of a Redis store (ignored with `memory://`).
#[derive(Clone, Debug, Args, Serialize, Deserialize)]
#[command(next_help_heading = "Store")]
pub struct RedisSettings {
    /// Prefix of every Redis key inflight names (Dify's layout keeps Dify's own names for the counts).
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
    /// The Redis key layout: inflight (its own), or dify (Dify's RateLimit keys, shared with unmodified
    /// Dify workers during a migration: see docs/dify.md).
    #[arg(long, env = "INFLIGHT_LAYOUT", value_name = "LAYOUT", value_enum)]
    #[arg(default_value = "inflight")]
    pub layout: Layout,
    /// Under --layout dify: how old a Dify worker's entry must be before an admission that needs its
    /// slot evicts it (Dify's own age is 600 s).
    #[arg(long, env = "INFLIGHT_DIFY_STALE_AFTER", value_name = "DURATION")]
    #[arg(default_value = "600s", value_parser = text::parse)]
    #[serde(with = "text")]
    pub dify_stale_after: Duration,
    /// Under --layout dify: Dify's REDIS_KEY_PREFIX (Dify 1.14 and later; read from that variable too),
    /// put before both of an app's keys as Dify's redis_client puts it
    /// (`<prefix>:dify:rate_limit:K:active_requests` and `...:max_active_requests`). Empty: none.
    #[arg(long, env = "INFLIGHT_REDIS_KEY_PREFIX", value_name = "PREFIX")]
    #[arg(default_value = "")]
    pub redis_key_prefix: String,
}

/// `--layout`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// inflight's own keys.
    Inflight,
    /// Dify's `dify:rate_limit:{app}:*` keys.
    Dify,
}

impl RedisSettings {
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if self.redis_ca_cert.is_some() && !cfg!(feature = "tls") {
            let reason = "this build has no TLS (build with --features tls)";
            return Err(invalid("redis_ca_cert", reason));
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
        if self.dify_stale_after < Duration::from_secs(1) {
            return Err(invalid("dify_stale_after", "must be 1s or more"));
        }
        Ok(())
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
}

/// What a password or user name may hold unescaped in a URL's user info.
const USERINFO: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The store URL Dify's own variables describe (its `REDIS_*` settings), if they are set: a Sentinel
/// set when `REDIS_USE_SENTINEL`, a Cluster when `REDIS_USE_CLUSTERS`, else `REDIS_HOST`.
pub(super) fn dify_store_url(
    var: impl Fn(&str) -> Option<String>,
) -> Result<Option<String>, ConfigError> {
    let var = |name: &str| var(name).filter(|value| !value.trim().is_empty());
    let flag = |name: &str| match var(name).map(|v| v.trim().to_ascii_lowercase()) {
        None => Ok(false),
        Some(v) if ["1", "true", "yes", "on"].contains(&v.as_str()) => Ok(true),
        Some(v) if ["0", "false", "no", "off"].contains(&v.as_str()) => Ok(false),
        Some(v) => Err(invalid(name, format!("{v:?} is not true or false"))),
    };
    let tls = if flag("REDIS_USE_SSL")? {
        "rediss"
    } else {
        "redis"
    };
    let auth = |user: Option<String>, password: Option<String>| match (user, password) {
        (None, None) => String::new(),
        (user, password) => format!(
            "{}:{}@",
            utf8_percent_encode(&user.unwrap_or_default(), USERINFO),
            utf8_percent_encode(&password.unwrap_or_default(), USERINFO)
        ),
    };
    let db = match var("REDIS_DB") {
        None => 0,
        Some(db) => db
            .trim()
            .parse::<u32>()
            .map_err(|_| invalid("REDIS_DB", format!("{db:?} is not a database number")))?,
    };
    if flag("REDIS_USE_SENTINEL")? {
        let nodes = var("REDIS_SENTINELS")
            .ok_or_else(|| invalid("REDIS_SENTINELS", "REDIS_USE_SENTINEL needs host:port,..."))?;
        let service = var("REDIS_SENTINEL_SERVICE_NAME")
            .ok_or_else(|| invalid("REDIS_SENTINEL_SERVICE_NAME", "REDIS_USE_SENTINEL needs it"))?;
        let mut url = format!(
            "{tls}+sentinel://{}{}/{}?db={db}",
            auth(var("REDIS_USERNAME"), var("REDIS_PASSWORD")),
            nodes.replace(' ', ""),
            utf8_percent_encode(&service, USERINFO)
        );
        for (name, param) in [
            ("REDIS_SENTINEL_USERNAME", "sentinel_username"),
            ("REDIS_SENTINEL_PASSWORD", "sentinel_password"),
        ] {
            if let Some(value) = var(name) {
                url.push_str(&format!(
                    "&{param}={}",
                    utf8_percent_encode(&value, USERINFO)
                ));
            }
        }
        return Ok(Some(url));
    }
    if flag("REDIS_USE_CLUSTERS")? {
        let nodes = var("REDIS_CLUSTERS")
            .ok_or_else(|| invalid("REDIS_CLUSTERS", "REDIS_USE_CLUSTERS needs host:port,..."))?;
        let auth = auth(None, var("REDIS_CLUSTERS_PASSWORD"));
        return Ok(Some(format!(
            "{tls}+cluster://{auth}{}",
            nodes.replace(' ', "")
        )));
    }
    let Some(host) = var("REDIS_HOST") else {
        return Ok(None);
    };
    let port = var("REDIS_PORT").unwrap_or_else(|| "6379".to_owned());
    let auth = auth(var("REDIS_USERNAME"), var("REDIS_PASSWORD"));
    Ok(Some(format!(
        "{tls}://{auth}{}:{}/{db}",
        host.trim(),
        port.trim()
    )))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn from(vars: &[(&str, &str)]) -> Result<Option<String>, ConfigError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        dify_store_url(|name| vars.get(name).cloned())
    }

    /// The URL `vars` make, as text ("" for none).
    fn url(vars: &[(&str, &str)]) -> String {
        from(vars).unwrap().unwrap_or_default()
    }

    #[test]
    fn difys_redis_variables_make_a_store_url_in_every_combination() {
        assert_eq!(url(&[]), "");
        assert_eq!(url(&[("REDIS_PORT", "6380")]), "");
        assert_eq!(url(&[("REDIS_HOST", "redis")]), "redis://redis:6379/0");
        assert_eq!(
            url(&[
                ("REDIS_HOST", "10.0.0.5"),
                ("REDIS_PORT", "6380"),
                ("REDIS_USERNAME", "dify"),
                ("REDIS_PASSWORD", "p@ss:w/rd"),
                ("REDIS_DB", "2"),
                ("REDIS_USE_SSL", "true"),
            ]),
            "rediss://dify:p%40ss%3Aw%2Frd@10.0.0.5:6380/2"
        );
        assert_eq!(
            url(&[("REDIS_HOST", "r"), ("REDIS_PASSWORD", "difyai123456")]),
            "redis://:difyai123456@r:6379/0"
        );
        assert_eq!(
            url(&[
                ("REDIS_HOST", "ignored"),
                ("REDIS_USE_SENTINEL", "True"),
                ("REDIS_SENTINELS", "s1:26379, s2:26379"),
                ("REDIS_SENTINEL_SERVICE_NAME", "mymaster"),
                ("REDIS_SENTINEL_USERNAME", "sen"),
                ("REDIS_SENTINEL_PASSWORD", "s&cret"),
                ("REDIS_PASSWORD", "primary"),
                ("REDIS_DB", "1"),
            ]),
            "redis+sentinel://:primary@s1:26379,s2:26379/mymaster?db=1\
             &sentinel_username=sen&sentinel_password=s%26cret"
        );
        assert_eq!(
            url(&[
                ("REDIS_USE_CLUSTERS", "1"),
                ("REDIS_CLUSTERS", "c1:6379,c2:6379,c3:6379"),
                ("REDIS_CLUSTERS_PASSWORD", "cl"),
                ("REDIS_USE_SSL", "yes"),
            ]),
            "rediss+cluster://:cl@c1:6379,c2:6379,c3:6379"
        );
        assert_eq!(
            url(&[
                ("REDIS_USE_CLUSTERS", "true"),
                ("REDIS_CLUSTERS", "c1:7000")
            ]),
            "redis+cluster://c1:7000"
        );
        // Off by any spelling: the plain host again.
        assert_eq!(
            url(&[
                ("REDIS_USE_SENTINEL", "false"),
                ("REDIS_USE_CLUSTERS", "0"),
                ("REDIS_HOST", "h")
            ]),
            "redis://h:6379/0"
        );
    }

    #[test]
    fn bad_dify_variables_are_named() {
        let named = |vars: &[(&str, &str)]| from(vars).unwrap_err().to_string();
        assert!(named(&[("REDIS_USE_SENTINEL", "true")]).contains("REDIS_SENTINELS"));
        assert!(
            named(&[("REDIS_USE_SENTINEL", "true"), ("REDIS_SENTINELS", "s:1")])
                .contains("REDIS_SENTINEL_SERVICE_NAME")
        );
        assert!(named(&[("REDIS_USE_CLUSTERS", "on")]).contains("REDIS_CLUSTERS"));
        assert!(named(&[("REDIS_HOST", "h"), ("REDIS_DB", "x")]).contains("REDIS_DB"));
        assert!(named(&[("REDIS_USE_SSL", "maybe")]).contains("REDIS_USE_SSL"));
    }
}
