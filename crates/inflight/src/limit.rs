//! The limit rule: a key's effective limit from its class's default and ceiling and its override.
//!
//! The same rule lives in two more places, which must agree with this one: `resolve` in
//! `store/redis/scripts/base.lua` (inside every Redis decision) and `ClassLimits.resolve` in the Python
//! client (`clients/python/src/inflight_client/_policy.py`). `tests/stores_agree.rs` checks the Lua one
//! against this one (the memory store's), and `test_keys_and_policy.py` the Python one against the
//! reference cases below.

use std::fmt;

/// The limits of a class of keys: a default and a ceiling (0 = none).
///
/// A key's own limit is its override when that is > 0, else `default_limit`. The effective limit is the
/// smaller of that and `max_limit`, counting only values > 0; when neither is > 0 the key is unlimited.
///
/// ```
/// use inflight::{ClassLimits, Limit};
///
/// // ceiling / default / override -> effective, as the reference system resolves them.
/// assert_eq!(ClassLimits::new(0, 0).resolve(None), Limit::Unlimited);
/// assert_eq!(ClassLimits::new(0, 0).resolve(Some(5)), Limit::Limited(5));
/// assert_eq!(ClassLimits::new(0, 10).resolve(None), Limit::Limited(10));
/// assert_eq!(ClassLimits::new(0, 20).resolve(Some(5)), Limit::Limited(5));
/// assert_eq!(ClassLimits::new(15, 0).resolve(None), Limit::Limited(15));
/// // An override may be above the default, not above the ceiling.
/// assert_eq!(ClassLimits::new(3, 0).resolve(Some(5)), Limit::Limited(5));
/// assert_eq!(ClassLimits::new(3, 4).resolve(Some(5)), Limit::Limited(4));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ClassLimits {
    /// The limit of a key without an override; 0 = unlimited.
    pub default_limit: u32,
    /// The ceiling over the limit of every key of the class, overrides included; 0 = no ceiling.
    pub max_limit: u32,
}

impl ClassLimits {
    /// Limits with this default and ceiling (0 = none).
    pub const fn new(default_limit: u32, max_limit: u32) -> Self {
        Self {
            default_limit,
            max_limit,
        }
    }

    /// The effective limit of a key whose override is `override_limit` (`None` or `Some(0)`: no override).
    pub const fn resolve(&self, override_limit: Option<u32>) -> Limit {
        let own = match override_limit {
            Some(n) if n > 0 => n,
            _ => self.default_limit,
        };
        Limit::from_u32(match (own, self.max_limit) {
            (0, cap) => cap,
            (own, 0) => own,
            (own, cap) if own < cap => own,
            (_, cap) => cap,
        })
    }

    /// True when a key of the class is unlimited unless it has an override: both settings are 0.
    pub const fn is_unlimited(&self) -> bool {
        self.default_limit == 0 && self.max_limit == 0
    }
}

/// An effective limit: unlimited, or at most `n` (> 0) in flight at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Limit {
    /// No limit: admission needs no store.
    Unlimited,
    /// At most this many (always > 0) in flight at once.
    Limited(u32),
}

impl Limit {
    /// `0` is [`Limit::Unlimited`], anything else is [`Limit::Limited`].
    pub const fn from_u32(n: u32) -> Self {
        if n == 0 {
            Self::Unlimited
        } else {
            Self::Limited(n)
        }
    }

    /// The limit as a number, `None` when unlimited.
    pub const fn get(self) -> Option<u32> {
        match self {
            Self::Unlimited => None,
            Self::Limited(n) => Some(n),
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unlimited => f.write_str("unlimited"),
            Self::Limited(n) => write!(f, "{n}"),
        }
    }
}

/// A policy that could not be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PolicyError(String);

impl PolicyError {
    pub(crate) fn new(why: String) -> Self {
        Self(why)
    }
}
