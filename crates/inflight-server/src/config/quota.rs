//! The settings of quotas: when a reservation taken with a permit is committed, and how long an
//! unsettled one lasts.

use std::time::Duration;

use clap::{Args, ValueEnum};
use inflight::quota::{CommitOn, MAX_RESERVATION_TTL};
use serde::{Deserialize, Serialize};

use super::{invalid, text, ConfigError};

/// The settings of quotas (balances per key, charged around admissions).
#[derive(Clone, Debug, Args, Serialize, Deserialize)]
#[command(next_help_heading = "Quotas")]
pub struct QuotaSettings {
    /// When a reservation taken with a permit (a "quota" in an acquire body, --quota-key in the proxy)
    /// is committed: on_success (when the permit is released with ?outcome=success, or the proxied
    /// response ended below 500; anything else refunds it) or on_admission (once admitted, whatever
    /// follows: the reference system's billing of started runs).
    #[arg(long, env = "INFLIGHT_QUOTA_COMMIT", value_name = "WHEN", value_enum)]
    #[arg(default_value = "on_success")]
    pub quota_commit: QuotaCommit,
    /// How long a reservation lasts unless settled, when its request names no ttl: then the store
    /// refunds it (so a crashed worker loses no credit). A permit's reservation is extended by as much
    /// at each renewal of the permit, and the proxy's while its response runs, so long work is charged.
    #[arg(long, env = "INFLIGHT_QUOTA_TTL", value_name = "DURATION")]
    #[arg(default_value = "1h", value_parser = text::parse)]
    #[serde(with = "text")]
    pub quota_ttl: Duration,
}

/// `--quota-commit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum QuotaCommit {
    /// When the work succeeds.
    OnSuccess,
    /// When the request is admitted.
    OnAdmission,
}

impl From<QuotaCommit> for CommitOn {
    fn from(commit: QuotaCommit) -> Self {
        match commit {
            QuotaCommit::OnSuccess => Self::Success,
            QuotaCommit::OnAdmission => Self::Admission,
        }
    }
}

impl QuotaSettings {
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if self.quota_ttl < Duration::from_secs(1) || self.quota_ttl > MAX_RESERVATION_TTL {
            return Err(invalid("quota_ttl", "must be between 1s and 24h"));
        }
        Ok(())
    }
}
