//! The task that keeps a view of an index fresh (`overrides.rs`), and how stale the view can be.
//!
//! It subscribes to the index's channel (through one node of a cluster, the next one when it fails),
//! reads the whole index, then applies each announcement as it comes, and reads the version every
//! [`POLL`], whether subscribed or not:
//!
//! - Subscribed: a change applies in this process when its announcement arrives; when one is lost, the
//!   index is read again once the version shows it still missing a [`POLL`] after it was read, or going
//!   back (Redis lost its data): within two [`POLL`]s and a read of the index.
//! - Not subscribed while Redis answers (the subscription refused: `maxclients` reached, an ACL without
//!   the channel; it is tried again every [`RESUBSCRIBE`]): the index is read again whenever the version
//!   differs from the view's, so a change applies within one [`POLL`] after it was made, plus a read of
//!   the version and one of the index.
//! - Redis refuses the view's reads (`NOPERM`, a failed authentication): the view is not trusted (every
//!   admission asks Redis) until a read succeeds again.
//! - Redis does not answer (down, unreachable, timing out): the last view stays in force.
//!
//! Each read is one round trip, bounded by the store's response timeout.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Once, Weak};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use redis::{AsyncCommands, ErrorKind, RedisError, RedisResult, ServerErrorKind};

use super::connect::Conn;
use super::overrides::{Names, View, MAX_VIEW};

/// How often the version of the index is read.
pub(super) const POLL: Duration = Duration::from_millis(50);
/// How long after a failed subscription it is tried again (the view is polled meanwhile).
const RESUBSCRIBE: Duration = Duration::from_secs(1);
/// How long connecting and subscribing may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

type Messages = Pin<Box<dyn Stream<Item = redis::Msg> + Send>>;
type Read = Pin<Box<dyn Future<Output = RedisResult<u64>> + Send>>;

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

/// Starts the task that keeps `view` fresh; it ends soon after the last handle on the view goes.
pub(super) fn start(conn: Conn, names: Names, view: &Arc<View>) {
    tokio::spawn(keep(conn, names, Arc::downgrade(view)));
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

async fn keep(conn: Conn, names: Names, view: Weak<View>) {
    let _keeper = Keeper(view.clone());
    let mut reader = Reader {
        conn,
        names,
        view,
        stale: true,
    };
    let mut warned = false;
    // Which node (of a cluster's) the subscription goes through: the next one after each failure.
    let mut attempt = 0;
    let mut pause = Duration::ZERO;
    loop {
        // A task of its own (ended with this one): the polls below await in turn, and must not wait
        // on something a suspended subscription attempt holds (a Sentinel store's lookup).
        let channel = reader.names.channel.clone();
        let mut subscribing = tokio::task::JoinSet::new();
        subscribing.spawn(subscribe(reader.conn.clone(), channel, attempt, pause));
        let mut poll = tokio::time::interval(POLL);
        let subscribed = loop {
            tokio::select! {
                biased;
                Some(subscribed) = subscribing.join_next() => {
                    break subscribed.unwrap_or_else(|e| Err(std::io::Error::other(e).into()));
                }
                _ = poll.tick() => {
                    if !reader.poll_unsubscribed().await {
                        return;
                    }
                }
            }
        };
        attempt += 1;
        // Soon after a subscription that broke (Redis restarting), less often after one refused.
        let (error, next_pause) = match subscribed {
            Ok(messages) => match reader.follow(messages).await {
                Ok(()) => return,
                Err(error) => (error, POLL),
            },
            Err(error) => (error, RESUBSCRIBE),
        };
        if reader.view.strong_count() == 0 {
            return;
        }
        // Once, then quietly: an outage says so elsewhere. (A user whose ACL has no access to the
        // channel would see it here.)
        if !warned {
            let what = reader.names.what;
            tracing::warn!(%error, "the view of {what} lost its subscription; polling its version until it is remade");
            warned = true;
        }
        pause = next_pause;
    }
}

/// Subscribes to `channel` after `pause`.
async fn subscribe(
    conn: Conn,
    channel: String,
    attempt: usize,
    pause: Duration,
) -> RedisResult<Messages> {
    tokio::time::sleep(pause).await;
    let client = conn.pubsub_client(attempt).await?;
    let mut pubsub = within(client.get_async_pubsub()).await?;
    within(pubsub.subscribe(&channel)).await?;
    Ok(Box::pin(pubsub.into_on_message()))
}

struct Reader {
    conn: Conn,
    names: Names,
    view: Weak<View>,
    /// The view must be read whole at the next poll: never read yet, or its reads were refused.
    stale: bool,
}

impl Reader {
    /// Not subscribed: reads the version, and the index when it differs from the view's (or the view is
    /// not usable). False when the view is gone.
    async fn poll_unsubscribed(&mut self) -> bool {
        let Some(applied) = self.view.upgrade().map(|view| view.version()) else {
            return false;
        };
        let read = match read_version(self.conn.clone(), &self.names).await {
            Ok(version) if version == applied && !self.stale => Ok(()),
            Ok(_) => self.resync().await,
            Err(error) => Err(error),
        };
        if let Err(error) = read {
            self.failed(&error);
        }
        true
    }

    /// Subscribed: reads the index, then follows the announcements until the subscription breaks (an
    /// error) or the view is no longer used (`Ok`). The version's reads run beside the announcements,
    /// which go on being applied while one is on its way; nothing else awaits beside one.
    async fn follow(&mut self, mut messages: Messages) -> RedisResult<()> {
        // Subscribed first: whatever changes while the index is read is announced after, and applied after.
        self.checked_resync().await?;
        let mut poll = tokio::time::interval(POLL);
        let mut reading: Option<(u64, Read)> = None;
        // The version one poll ago: every announcement up to it has had a whole poll to arrive.
        let mut due = 0u64;
        loop {
            tokio::select! {
                biased;
                message = messages.next() => {
                    let Some(message) = message else {
                        let ended = "the subscription to an index's announcements ended";
                        return Err(std::io::Error::new(std::io::ErrorKind::ConnectionAborted, ended).into());
                    };
                    let Some(view) = self.view.upgrade() else { return Ok(()) };
                    let payload: String = message.get_payload()?;
                    if !view.apply(&payload) {
                        drop(view);
                        // (Not beside a read still on its way, which may hold what the resync needs.)
                        reading = None;
                        self.checked_resync().await?;
                    }
                }
                read = async { reading.as_mut().expect("guarded").1.as_mut().await }, if reading.is_some() => {
                    let applied = reading.take().map_or(0, |(applied, _)| applied);
                    let version = self.checked(read)?;
                    // What has been applied never passes Redis's version (each announcement follows its
                    // INCR), so a version below it means Redis lost its data (a restart without
                    // persistence, FLUSHALL). One still behind what was due means one was lost.
                    if version < applied || applied < due {
                        self.checked_resync().await?;
                    }
                    due = version;
                }
                _ = poll.tick(), if reading.is_none() => {
                    let Some(view) = self.view.upgrade() else { return Ok(()) };
                    // The version applied is read before Redis's.
                    let applied = view.version();
                    reading = Some((applied, Box::pin(read_version(self.conn.clone(), &self.names))));
                }
            }
        }
    }

    /// Reads the whole index into the view.
    async fn resync(&mut self) -> RedisResult<()> {
        if self.view.strong_count() == 0 {
            return Ok(());
        }
        let version = read_version(self.conn.clone(), &self.names).await?;
        let mut keys = HashSet::new();
        let mut cursor = 0u64;
        let mut fits = true;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("HSCAN")
                .arg(&self.names.index)
                .arg(cursor)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut self.conn)
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
            let what = self.names.what;
            tracing::warn!(
                max = MAX_VIEW,
                "more keys are in the index of {what} than its view holds: every admission asks Redis"
            );
        }
        if let Some(view) = self.view.upgrade() {
            view.replace(keys, version, fits);
        }
        self.stale = false;
        Ok(())
    }

    async fn checked_resync(&mut self) -> RedisResult<()> {
        let read = self.resync().await;
        self.checked(read)
    }

    fn checked<T>(&mut self, read: RedisResult<T>) -> RedisResult<T> {
        if let Err(error) = &read {
            self.failed(error);
        }
        read
    }

    /// A read of the view failed: when Redis refused it (an ACL), the view is not trusted until a read
    /// succeeds; when Redis did not answer, the last view stays in force.
    fn failed(&mut self, error: &RedisError) {
        let refused = matches!(
            error.kind(),
            ErrorKind::Server(ServerErrorKind::NoPerm) | ErrorKind::AuthenticationFailed
        );
        if let (true, Some(view)) = (refused, self.view.upgrade()) {
            view.usable.store(false, Ordering::Release);
            self.stale = true;
        }
    }
}

fn read_version(mut conn: Conn, names: &Names) -> impl Future<Output = RedisResult<u64>> + use<> {
    let key = names.version.clone();
    async move {
        let version: Option<u64> = conn.get(key).await?;
        Ok(version.unwrap_or(0))
    }
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
