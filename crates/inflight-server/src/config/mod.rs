//! Settings: flags > environment > TOML file > defaults, each bad value named by its setting.
//!
//! Each setting is a field below: its flag, its `INFLIGHT_*` variable, its TOML key, its type, its default
//! and its help all come from there. When `INFLIGHT_DEFAULT_LIMIT` / `INFLIGHT_MAX_LIMIT` are unset, the
//! reference system's `APP_DEFAULT_ACTIVE_REQUESTS` / `APP_MAX_ACTIVE_REQUESTS` are honoured, so an existing
//! Dify deployment's settings carry over.

use std::path::Path;

use clap::{ArgMatches, Args, FromArgMatches, Parser, Subcommand};
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use check::{check, CheckArgs};
pub use connections::Connections;
pub use inflight::{MAX_LEASE, MIN_LEASE};
pub use logging::{plain_fields, LineTime, LogFormat, LoggingSettings};
pub use proxy::ProxySettings;
pub use quota::{QuotaCommit, QuotaSettings};
pub use rules::{FloorRule, LimitRule, Mode};
pub use settings::Settings;
pub use store::{Layout, RedisSettings};
pub use tls::TlsSettings;

mod check;
mod connections;
pub mod env;
mod layer;
mod logging;
mod proxy;
mod quota;
mod rules;
mod settings;
mod store;
mod text;
mod tls;

use layer::layer;

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
// (Parsed once at start: the size of the settings' variants costs nothing.)
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// The HTTP limiter API, for workers in any language.
    Serve(Settings),
    /// A reverse proxy that enforces the limits in front of an upstream API (and answers the API under
    /// /_inflight/).
    Proxy(ProxySettings),
    /// Drives the library directly (no HTTP) and prints one JSON line of throughput and latency.
    Bench(crate::bench::BenchArgs),
    /// Checks a settings file as `serve` (or `proxy`) would load it, environment included: exits 0, or
    /// names the setting that is wrong and why.
    CheckConfig(CheckArgs),
    /// Checks the histories of a fault run: certain over-admission, tokens going backwards, leaks, losses.
    ///
    /// Reads JSON-lines histories (docs/histories.md) as one history; reports over-admission only where
    /// certain, fencing tokens going backwards, slots leaked at the end, permits lost and the recovery
    /// after each fault. Exits 0 (nothing certain went wrong), 1 (over-admission or a token going
    /// backwards) or 2 (a file or line that cannot be read, named).
    CheckHistory {
        /// History files, one JSON object a line ("-": standard input); read as one history.
        #[arg(value_name = "FILE", required = true)]
        files: Vec<std::path::PathBuf>,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
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
        let flags: Vec<std::ffi::OsString> = flags.into_iter().map(Into::into).collect();
        let command = Self::augment_args(clap::Command::new("inflight"));
        let matches = command.clone().try_get_matches_from(&flags).map_err(|e| {
            match env::from_variable(&command, &flags, &e) {
                Some(named) => {
                    let first = named.lines().next().unwrap_or_default();
                    invalid("environment", first.trim_start_matches("error: "))
                }
                None => invalid("flags", e),
            }
        })?;
        let args = Self::from_arg_matches(&matches).map_err(|e| invalid("flags", e))?;
        args.layered(&matches)
    }
}
