//! The view of which keys have an override, kept in this process so that an admission on keys whose
//! classes are unlimited needs no round trip to Redis unless one of them has an override.
//!
//! Redis keeps the index: `<prefix>overrides`, a hash of every key with an override, and
//! `<prefix>overrides:version`, which counts its changes. `status.lua` changes both with the override
//! itself and publishes `'version +key'` (or `-key`) on the channel `<prefix>overrides` (on a Redis
//! Cluster, where the index is `<prefix>{overrides}` in a slot of its own, `index.lua` changes the index:
//! see `across.rs`; PUBLISH reaches every node). A task of the store subscribes (through one node of a
//! cluster, the next one when it fails), reads the whole index, then applies each announcement as it
//! comes; it reads the index again when an announcement is still missing one [`POLL`] after its version
//! was read, or the version went back (Redis lost its data). So a new override applies to this process's
//! next admission within moments, and within two [`POLL`]s when its announcement was lost. While Redis
//! cannot be reached, the last view stays in force (no one can set an override there meanwhile). Until
//! the first read completes, past [`MAX_VIEW`] keys, or if the task ends, every admission asks Redis.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Once, RwLock, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::AsyncCommands;

use super::connect::Conn;

/// How often the version of the index is read, to catch a lost announcement (within two of these).
pub(super) const POLL: Duration = Duration::from_millis(50);
/// The most keys with an override the view holds; past that, every admission asks Redis.
pub(super) const MAX_VIEW: usize = 1 << 20;
/// How long connecting and subscribing may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

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

/// The view of the keys with a balance (`quota.rs`), shared by a store's clones.
pub(super) struct Metered {
    pub(super) names: Names,
    pub(super) view: Arc<View>,
    started: Once,
}

impl Metered {
    pub(super) fn new(prefix: &str, cluster: bool) -> Self {
        Self {
            names: Names::new(prefix, "quotas", cluster),
            view: Arc::default(),
            started: Once::new(),
        }
    }

    /// True when the view knows that `key` has no balance (starting the view on the first call).
    pub(super) fn unmetered(&self, conn: &Conn, key: &str) -> bool {
        self.started
            .call_once(|| start(conn.clone(), self.names.clone(), &self.view));
        self.view.none_of(&[key])
    }
}

/// The view: shared by a store's clones, kept by one task.
#[derive(Default)]
pub(super) struct View {
    keys: RwLock<HashSet<Box<str>>>,
    /// The index has been read at least once and fits in [`MAX_VIEW`].
    usable: AtomicBool,
    /// The last version applied.
    version: AtomicU64,
}

impl View {
    /// True when the view is usable and none of `keys` has an override.
    #[inline]
    pub(super) fn none_of(&self, keys: &[&str]) -> bool {
        if !self.usable.load(Ordering::Acquire) {
            return false;
        }
        let known = self.keys.read().unwrap_or_else(|e| e.into_inner());
        keys.iter().all(|key| !known.contains(*key))
    }

    /// Notes an override this process set or cleared, so that its own next admission sees it at once.
    pub(super) fn note(&self, key: &str, has_override: bool) {
        let mut known = self.keys.write().unwrap_or_else(|e| e.into_inner());
        if !has_override {
            known.remove(key);
        } else if known.len() < MAX_VIEW {
            known.insert(key.into());
        } else {
            self.usable.store(false, Ordering::Release);
        }
    }

    /// Applies one announcement; false when it is not one, or shows that one before it was missed. One
    /// no newer than what the view holds (read again after a resync) is skipped.
    fn apply(&self, message: &str) -> bool {
        let Some((version, change)) = message.split_once(' ') else {
            return false;
        };
        let Ok(version) = version.parse::<u64>() else {
            return false;
        };
        let seen = self.version.load(Ordering::Acquire);
        if version <= seen {
            return true;
        }
        let mut known = self.keys.write().unwrap_or_else(|e| e.into_inner());
        if let Some(key) = change.strip_prefix('+') {
            if known.len() < MAX_VIEW {
                known.insert(key.into());
            } else {
                self.usable.store(false, Ordering::Release);
            }
        } else if let Some(key) = change.strip_prefix('-') {
            known.remove(key);
        } else {
            return false;
        }
        self.version.store(version, Ordering::Release);
        version == seen + 1
    }
}

/// Marks the view unusable when the task that keeps it ends other than because the view went (a panic,
/// its runtime shut down): admissions then ask Redis rather than trust a view no one updates.
struct Keeper(Weak<View>);

impl Drop for Keeper {
    fn drop(&mut self) {
        if let Some(view) = self.0.upgrade() {
            view.usable.store(false, Ordering::Release);
        }
    }
}

/// Starts the task that keeps `view` fresh; it ends soon after the last handle on the view goes.
pub(super) fn start(conn: Conn, names: Names, view: &Arc<View>) {
    tokio::spawn(keep(conn, names, Arc::downgrade(view)));
}

async fn keep(conn: Conn, names: Names, view: Weak<View>) {
    let _keeper = Keeper(view.clone());
    let mut warned = false;
    // Which node (of a cluster's) the subscription goes through: the next one after each failure.
    let mut attempt = 0;
    while view.strong_count() > 0 {
        attempt += 1;
        let followed = match conn.pubsub_client(attempt - 1).await {
            Ok(client) => follow(&client, conn.clone(), &names, &view).await,
            Err(error) => Err(error),
        };
        match followed {
            Ok(()) => return,
            Err(error) => {
                // Once, then quietly: an outage says so elsewhere. (A user whose ACL has no access to
                // the channel would see it here.)
                if !warned {
                    let what = names.what;
                    tracing::warn!(%error, "the view of {what} lost its subscription; remaking it");
                    warned = true;
                }
                // Soon: the view is in force meanwhile, and only a subscription keeps it fresh.
                tokio::time::sleep(POLL).await;
            }
        }
    }
}

/// Subscribes, reads the index, then follows the announcements until the subscription breaks (an
/// error) or the view is no longer used (`Ok`).
async fn follow(
    client: &redis::Client,
    mut conn: Conn,
    names: &Names,
    view: &Weak<View>,
) -> redis::RedisResult<()> {
    let mut pubsub = within(client.get_async_pubsub()).await?;
    within(pubsub.subscribe(&names.channel)).await?;
    let mut messages = pubsub.into_on_message();
    // Subscribed first: whatever changes while the index is read is announced after, and applied after.
    resync(&mut conn, names, view).await?;
    let mut poll = tokio::time::interval(POLL);
    // The version one poll ago: every announcement up to it has had a whole poll to arrive.
    let mut due = 0u64;
    loop {
        tokio::select! {
            biased;
            message = messages.next() => {
                let Some(message) = message else {
                    return Err(closed());
                };
                let Some(strong) = view.upgrade() else { return Ok(()) };
                let payload: String = message.get_payload()?;
                if !strong.apply(&payload) {
                    drop(strong);
                    resync(&mut conn, names, view).await?;
                }
            }
            _ = poll.tick() => {
                // What has been applied never passes Redis's version (each announcement follows its
                // INCR), so read it first: a version below it means Redis lost its data (a restart
                // without persistence, FLUSHALL). One still behind what was due means one was lost.
                let Some(applied) = view.upgrade().map(|v| v.version.load(Ordering::Acquire)) else {
                    return Ok(());
                };
                let version: Option<u64> = conn.get(&names.version).await?;
                let version = version.unwrap_or(0);
                if version < applied || applied < due {
                    resync(&mut conn, names, view).await?;
                }
                due = version;
            }
        }
    }
}

/// Reads the whole index into the view.
async fn resync(conn: &mut Conn, names: &Names, view: &Weak<View>) -> redis::RedisResult<()> {
    let Some(view) = view.upgrade() else {
        return Ok(());
    };
    let version: Option<u64> = conn.get(&names.version).await?;
    let mut keys = HashSet::new();
    let mut cursor = 0u64;
    let mut fits = true;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("HSCAN")
            .arg(&names.index)
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        // HSCAN answers field, value, field, value...
        for key in batch.into_iter().step_by(2) {
            if keys.len() >= MAX_VIEW {
                fits = false;
                break;
            }
            keys.insert(key.into_boxed_str());
        }
        if next == 0 || !fits {
            break;
        }
        cursor = next;
    }
    if !fits {
        let what = names.what;
        tracing::warn!(
            max = MAX_VIEW,
            "more keys are in the index of {what} than its view holds: every admission asks Redis"
        );
    }
    *view.keys.write().unwrap_or_else(|e| e.into_inner()) = keys;
    view.version.store(version.unwrap_or(0), Ordering::Release);
    view.usable.store(fits, Ordering::Release);
    Ok(())
}

/// Adds (`'+'`) `key` to the index `names`, with `value`, or removes it (`'-'`), announcing the change
/// (`index.lua`); false when adding it would pass `max` keys (0: no bound).
pub(super) async fn change(
    conn: &Conn,
    names: &Names,
    max: usize,
    op: char,
    key: &str,
    value: u32,
) -> Result<bool, crate::error::StoreError> {
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
    Ok(out != -1)
}

pub(super) async fn within<T>(
    work: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    match tokio::time::timeout(CONNECT_TIMEOUT, work).await {
        Ok(result) => result,
        Err(_) => Err(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "connecting the subscription timed out",
        ))),
    }
}

fn closed() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "the subscription to an index's announcements ended",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_apply_in_order_and_a_gap_shows() {
        let view = View::default();
        view.usable.store(true, Ordering::Release);
        assert!(view.apply("1 +app:a"));
        assert!(!view.none_of(&["x", "app:a"]));
        assert!(view.apply("2 -app:a"));
        assert!(view.none_of(&["app:a"]));
        assert!(view.apply("3 +k with spaces"));
        assert!(!view.none_of(&["k with spaces"]));
        assert!(!view.apply("5 +b"), "4 was missed");
        assert!(view.apply("2 -app:a"), "an old one read again is no gap");
        assert!(!view.apply("garbage"));
    }
}
