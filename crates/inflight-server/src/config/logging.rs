//! The settings of the log: its format, its level, and the proxy's access lines.

use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

use super::{invalid, ConfigError};

/// The settings of the log (on stderr).
#[derive(Clone, Debug, Args, Serialize, Deserialize)]
#[command(next_help_heading = "Logging and metrics")]
pub struct LoggingSettings {
    /// How log lines are written: text (for people) or json (one object a line, for collectors).
    #[arg(long, env = "INFLIGHT_LOG_FORMAT", value_name = "FORMAT", value_enum)]
    #[arg(default_value = "text")]
    pub log_format: LogFormat,
    /// Which lines are written: a level (error, warn, info, debug, trace) or tracing directives, e.g.
    /// 'info,inflight::access=off'. SIGHUP puts it in force again.
    #[arg(long, env = "INFLIGHT_LOG", value_name = "DIRECTIVES")]
    #[arg(default_value = "info")]
    pub log_level: String,
    /// The proxy's access line for each request (target inflight::access, level info): method, path
    /// without its query, status, result, the key's hash (the key itself with --metrics-per-key),
    /// duration. Never a header or a query string.
    #[arg(long, env = "INFLIGHT_ACCESS_LOG", value_name = "BOOL")]
    #[arg(default_value_t = true, action = clap::ArgAction::Set)]
    pub access_log: bool,
}

/// `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object a line.
    Json,
}

impl LoggingSettings {
    /// The filter that `log_level` describes.
    pub fn filter(&self) -> Result<tracing_subscriber::EnvFilter, ConfigError> {
        tracing_subscriber::EnvFilter::try_new(&self.log_level).map_err(|e| {
            let reason = format!("{:?} (--log-level, INFLIGHT_LOG): {e}", self.log_level);
            invalid("log_level", reason)
        })
    }

    pub(super) fn check(&self) -> Result<(), ConfigError> {
        self.filter().map(drop)
    }
}
