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

/// The time of a log line as tracing-subscriber's `SystemTime` writes it (RFC 3339 in UTC, to the
/// microsecond), formatted by humantime: a fifth of the instructions, which counts in an access line.
#[derive(Clone, Copy, Debug, Default)]
pub struct LineTime;

impl tracing_subscriber::fmt::time::FormatTime for LineTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        write_time(std::time::SystemTime::now(), w)
    }
}

fn write_time(
    time: std::time::SystemTime,
    w: &mut tracing_subscriber::fmt::format::Writer<'_>,
) -> std::fmt::Result {
    use tracing_subscriber::fmt::time::FormatTime;
    // humantime writes the years 1970 to 9999; tracing-subscriber any other.
    match time.duration_since(std::time::UNIX_EPOCH) {
        Ok(since) if since.as_secs() < 253_402_300_800 => {
            write!(w, "{}", humantime::format_rfc3339_micros(time))
        }
        _ => tracing_subscriber::fmt::time::SystemTime.format_time(w),
    }
}

/// The fields of a text line without colours, as tracing-subscriber's default writes them then
/// (`message name=value ...`, values as `Debug`), at half its instructions: it styles every name and `=`
/// even when styles are off.
pub fn plain_fields(
) -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> + Send + Sync + 'static {
    use tracing_subscriber::field::MakeExt;
    tracing_subscriber::fmt::format::debug_fn(|w, field, value| match field.name() {
        "message" => write!(w, "{value:?}"),
        name => {
            w.write_str(name.strip_prefix("r#").unwrap_or(name))?;
            w.write_char('=')?;
            write!(w, "{value:?}")
        }
    })
    .delimited(" ")
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use tracing_subscriber::fmt::format::Writer;

    #[test]
    fn a_line_time_is_rfc3339_in_utc_to_the_microsecond() {
        let mut text = String::new();
        let time = UNIX_EPOCH + Duration::new(1_518_568_087, 123_456_789);
        super::write_time(time, &mut Writer::new(&mut text)).unwrap();
        assert_eq!(text, "2018-02-14T00:28:07.123456Z");
    }
}
