//! The view of which keys have an override, kept in this process so that an admission on keys whose
//! classes are unlimited needs no round trip to Redis unless one of them has an override.
//!
//! Redis keeps the index: `<prefix>overrides`, a hash of every key with an override, and
//! `<prefix>overrides:version`, which counts its changes. `status.lua` changes both with the override
//! itself and publishes `'version +key'` (or `-key`) on the channel `<prefix>overrides` (on a Redis
//! Cluster, where the index is `<prefix>{overrides}` in a slot of its own, `index.lua` changes the index:
//! see `across.rs`; PUBLISH reaches every node). A task (`keeper.rs`) keeps the view fresh from the
//! announcements and a poll of the version; it says how stale the view can be.
//!
//! The view never goes back: an announcement no newer than the version it holds is skipped, and a change
//! this process made is noted with the version of the index it left (so its own next admission sees it at
//! once) and stands over the older announcements of its key that may still arrive after it.
//! Until the first read completes, past [`MAX_VIEW`] keys, while Redis refuses the view's reads, or if
//! the task ends, every admission asks Redis.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::RwLock;

use super::connect::Conn;

/// The most keys with an override the view holds; past that, every admission asks Redis.
pub(super) const MAX_VIEW: usize = 1 << 20;

/// The names of an index in Redis: `what` is `overrides` (the keys with an override) or `quotas` (the
/// keys with a balance, kept the same way: `quota.rs`).
#[derive(Clone)]
pub(super) struct Names {
    pub(super) what: &'static str,
    pub(super) index: String,
    pub(super) version: String,
    pub(super) channel: String,
}

impl Names {
    /// On a Redis Cluster the index and its version share a hash tag, `{overrides}` (or `{quotas}`, or
    /// the prefix's own), so that one script changes both.
    pub(super) fn new(prefix: &str, what: &'static str, cluster: bool) -> Self {
        let index = if cluster {
            format!("{prefix}{{{what}}}")
        } else {
            format!("{prefix}{what}")
        };
        Self {
            what,
            version: format!("{index}:version"),
            index,
            channel: format!("{prefix}{what}"),
        }
    }
}

/// The view: shared by a store's clones, kept by one task.
#[derive(Default)]
pub(super) struct View {
    known: RwLock<Known>,
    /// The index has been read at least once, fits in [`MAX_VIEW`], and Redis does not refuse its reads.
    pub(super) usable: AtomicBool,
    /// The last version applied (changed only with `known` locked).
    version: AtomicU64,
}

#[derive(Default)]
struct Known {
    keys: HashSet<Box<str>>,
    /// The changes of this process whose announcements have not been applied yet: key -> the version of
    /// the index they left, and whether the key was in it then.
    ahead: HashMap<Box<str>, (u64, bool)>,
}

impl Known {
    /// False when the key does not fit.
    fn set(&mut self, key: &str, present: bool) -> bool {
        if !present {
            self.keys.remove(key);
        } else if self.keys.len() < MAX_VIEW {
            self.keys.insert(key.into());
        } else {
            return self.keys.contains(key);
        }
        true
    }
}

impl View {
    /// True when the view is usable and none of `keys` has an override.
    #[inline]
    pub(super) fn none_of(&self, keys: &[&str]) -> bool {
        if !self.usable.load(Ordering::Acquire) {
            return false;
        }
        let known = self.known.read().unwrap_or_else(|e| e.into_inner());
        keys.iter().all(|key| !known.keys.contains(*key))
    }

    /// The last version applied.
    pub(super) fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Notes a change this process made: `key` was in the index (`present`) or not as of its `version`,
    /// so that its own next admission sees it at once. A version the view already holds is no news (what
    /// the view holds is that or newer); otherwise the note stands until the view reaches its version.
    pub(super) fn note(&self, key: &str, present: bool, version: u64) {
        let mut known = self.known.write().unwrap_or_else(|e| e.into_inner());
        if version <= self.version.load(Ordering::Acquire) {
            return;
        }
        if !known.set(key, present) {
            self.usable.store(false, Ordering::Release);
        }
        let noted = known.ahead.entry(key.into()).or_insert((version, present));
        if noted.0 <= version {
            *noted = (version, present);
        }
    }

    /// Applies one announcement; false when it is not one, or shows that one before it was missed. One
    /// no newer than what the view holds (read again after a resync) is skipped, and so is one of a key
    /// this process changed later.
    pub(super) fn apply(&self, message: &str) -> bool {
        let Some((version, change)) = message.split_once(' ') else {
            return false;
        };
        let Ok(version) = version.parse::<u64>() else {
            return false;
        };
        let (present, key) = match change.split_at_checked(1) {
            Some(("+", key)) => (true, key),
            Some(("-", key)) => (false, key),
            _ => return false,
        };
        let mut known = self.known.write().unwrap_or_else(|e| e.into_inner());
        let seen = self.version.load(Ordering::Acquire);
        if version <= seen {
            return true;
        }
        let later = known
            .ahead
            .get(key)
            .is_some_and(|(noted, _)| *noted > version);
        if !later && !known.set(key, present) {
            self.usable.store(false, Ordering::Release);
        }
        if !known.ahead.is_empty() {
            known.ahead.retain(|_, (noted, _)| *noted > version);
        }
        self.version.store(version, Ordering::Release);
        version == seen + 1
    }

    /// Replaces the view with the index as read at `version` (its keys read after it), usable when it
    /// fit. The notes of this process newer than `version` stand over it.
    pub(super) fn replace(&self, keys: HashSet<Box<str>>, version: u64, mut fits: bool) {
        let mut known = self.known.write().unwrap_or_else(|e| e.into_inner());
        known.keys = keys;
        let mut ahead = std::mem::take(&mut known.ahead);
        ahead.retain(|_, (noted, _)| *noted > version);
        for (key, (_, present)) in &ahead {
            fits &= known.set(key, *present);
        }
        known.ahead = ahead;
        self.version.store(version, Ordering::Release);
        self.usable.store(fits, Ordering::Release);
    }
}

/// Adds (`'+'`) `key` to the index `names`, with `value`, or removes it (`'-'`), announcing the change
/// (`index.lua`); the index's version after it, or `None` when adding it would pass `max` keys (0: no
/// bound).
pub(super) async fn change(
    conn: &Conn,
    names: &Names,
    max: usize,
    op: char,
    key: &str,
    value: u32,
) -> Result<Option<u64>, crate::error::StoreError> {
    let mut invocation = super::scripts::INDEX.prepare_invoke();
    invocation
        .key(&names.index)
        .key(&names.version)
        .arg(op.to_string())
        .arg(key)
        .arg(value)
        .arg(&names.channel)
        .arg(max);
    let out: i64 = super::error::invoke(conn, &invocation).await?;
    Ok(u64::try_from(out).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usable() -> View {
        let view = View::default();
        view.usable.store(true, Ordering::Release);
        view
    }

    #[test]
    fn announcements_apply_in_order_and_a_gap_shows() {
        let view = usable();
        assert!(view.apply("1 +app:a"));
        assert!(!view.none_of(&["x", "app:a"]));
        assert!(view.apply("2 -app:a"));
        assert!(view.none_of(&["app:a"]));
        assert!(view.apply("3 +k with spaces"));
        assert!(!view.none_of(&["k with spaces"]));
        assert!(!view.apply("5 +b"), "4 was missed");
        assert!(view.apply("2 -app:a"), "an old one read again is no gap");
        assert!(!view.apply("garbage"));
        assert!(!view.apply("6 *k"));
    }

    #[test]
    fn a_note_never_undoes_a_newer_announcement_nor_an_older_one_a_note() {
        let view = usable();
        // This process cleared k at version 2; k was set again elsewhere at 3, announced first.
        assert!(view.apply("1 +k"));
        assert!(view.apply("2 -k"));
        assert!(view.apply("3 +k"));
        view.note("k", false, 2);
        assert!(!view.none_of(&["k"]), "the newer announcement stands");
        // This process set j at 5; the announcement of an older clear (4) arrives after.
        view.note("j", true, 5);
        assert!(!view.none_of(&["j"]), "seen here at once");
        assert!(view.apply("4 -j"));
        assert!(!view.none_of(&["j"]), "the older announcement is skipped");
        assert!(view.apply("5 +j"));
        assert!(
            view.apply("6 -j"),
            "past the note, announcements apply again"
        );
        assert!(view.none_of(&["j"]));
        assert_eq!(view.version(), 6);
        // A read of the index at 6 keeps a note of 7, and drops it once read at 7.
        view.note("n", true, 7);
        view.replace(HashSet::new(), 6, true);
        assert!(!view.none_of(&["n"]));
        view.replace(HashSet::new(), 7, true);
        assert!(view.none_of(&["n", "k"]));
    }
}
