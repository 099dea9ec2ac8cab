//! [`QuotaStats`]: how reservations have ended, and the last balance seen of each key, for metrics.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use super::store::{Balance, Settle, Settlement};

/// How reservations have ended, for metrics, and (when made with [`QuotaStats::with_balances`]) the
/// last balance seen of each key. Handles made with [`crate::Quota::with_stats`] share one.
#[derive(Debug, Default)]
pub struct QuotaStats {
    /// Reservations committed (spent).
    pub committed: AtomicU64,
    /// Reservations refunded by their holders.
    pub refunded: AtomicU64,
    /// Reservations the store refunded because their ttl passed: a sign of crashed holders.
    pub expired: AtomicU64,
    /// The last balance each key was answered with, and how many keys it may hold.
    balances: Option<(Mutex<Balances>, usize)>,
}

/// The last balance seen of each key.
type Balances = HashMap<Box<str>, Balance>;

impl QuotaStats {
    /// Stats that also keep the last balance the store answered for each key, of at most `max` keys
    /// (the first ones seen; later keys go untracked).
    pub fn with_balances(max: usize) -> Self {
        Self {
            balances: Some((Mutex::default(), max)),
            ..Self::default()
        }
    }

    /// The last balance this process saw of each tracked key (empty unless made with
    /// [`QuotaStats::with_balances`]); another process may have changed it since.
    pub fn balances(&self) -> Vec<(Box<str>, Balance)> {
        let Some((balances, _)) = &self.balances else {
            return Vec::new();
        };
        let balances = balances.lock().unwrap_or_else(PoisonError::into_inner);
        balances.iter().map(|(k, b)| (k.clone(), *b)).collect()
    }

    pub(crate) fn saw(&self, key: &str, balance: Option<&Balance>) {
        let Some(balance) = balance else { return };
        self.saw_expired(balance.expired);
        if let Some((balances, max)) = &self.balances {
            let mut balances = balances.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(last) = balances.get_mut(key) {
                *last = *balance;
            } else if balances.len() < *max {
                balances.insert(key.into(), *balance);
            }
        }
    }

    /// Counts reservations the store refunded because their ttl passed.
    pub(crate) fn saw_expired(&self, expired: u32) {
        if expired > 0 {
            self.expired
                .fetch_add(u64::from(expired), Ordering::Relaxed);
        }
    }

    pub(crate) fn settled(&self, key: &str, settle: Settle, settlement: &Settlement) {
        self.saw(key, settlement.balance().as_ref());
        if let Settlement::Settled(_) = settlement {
            let counter = match settle {
                Settle::Commit => &self.committed,
                Settle::Refund => &self.refunded,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }
}
