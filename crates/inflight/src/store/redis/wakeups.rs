//! Wake-ups for waiters on Redis: a release publishes on its key's channel (named by the store:
//! `batch.lua`, `dify.lua`), and each store handle subscribes to the channels of the keys its waiters
//! wait on, over a connection of its own, opened at the first interest. Where the store names a marker
//! (`batch.lua`'s `{E}:waiting`), a release is announced only while a marker says someone listens: each
//! store handle sets its keys' markers once subscribed, before their waiters ask again, and keeps them
//! alive while it waits.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::Client;
use tokio::sync::mpsc;

use super::connect::Conn;
use super::keeper::within;
use crate::store::wake::{Hook, Topic, Wakes};

/// How long to wait before subscribing again after the subscription broke.
const RETRY: Duration = Duration::from_millis(100);

/// How long a marker lives unless kept alive, and how often it is: a process gone leaves releases
/// announced to no one for at most `MARK_MS`.
const MARK_MS: u64 = 3_000;
const MARK_EVERY: Duration = Duration::from_millis(1_000);

/// The name of a key's marker, for stores whose releases are announced only while it is there.
pub(super) type Marker = Box<dyn Fn(&str) -> String + Send + Sync>;

/// The wake-ups of a store whose releases on a key are announced on `channel_of(key)`, and the task
/// that keeps its subscriptions; it ends with the store.
pub(super) fn start(
    conn: Conn,
    channel_of: impl Fn(&str) -> String + Send + Sync + 'static,
    marker_of: Option<Marker>,
    turns: Option<String>,
) -> Arc<Wakes> {
    let (changes, wanted) = mpsc::unbounded_channel();
    let hook: Hook = Box::new(move |topic, on| {
        let topic = match topic {
            Topic::Key(key) => Some(key.clone()),
            Topic::Turns => None,
        };
        let _ = changes.send((topic, on));
    });
    let wakes = Arc::new(match turns.clone() {
        Some(channel) => Wakes::with_tickets(hook, channel),
        None => Wakes::with_hook(hook),
    });
    let names = Names {
        channel_of,
        marker_of,
        turns,
    };
    tokio::spawn(follow(conn, names, Arc::downgrade(&wakes), wanted));
    wakes
}

/// A key's releases, or (`None`) the store's turns, wanted or not.
type Changes = mpsc::UnboundedReceiver<(Option<Arc<str>>, bool)>;

/// What is subscribed to: a key's releases, or (`None`) the store's turns.
type Channels = HashMap<String, Option<Arc<str>>>;

/// A key's channel, and its marker if the store has them; the channel of the store's turns.
struct Names<F> {
    channel_of: F,
    marker_of: Option<Marker>,
    turns: Option<String>,
}

impl<F: Fn(&str) -> String> Names<F> {
    fn channel(&self, topic: Option<&Arc<str>>) -> String {
        match topic {
            Some(key) => (self.channel_of)(key),
            None => self.turns.clone().unwrap_or_default(),
        }
    }
}

async fn follow<F: Fn(&str) -> String>(
    conn: Conn,
    names: Names<F>,
    wakes: Weak<Wakes>,
    mut changes: Changes,
) {
    // Channel -> key, for every key with an interest (and the turns', while tickets wait).
    let mut channels: Channels = HashMap::new();
    // Which node (of a cluster's: PUBLISH reaches them all) to subscribe through: the next after a failure.
    let mut attempt = 0;
    loop {
        if channels.is_empty() {
            // Nothing to hear until a first interest (or the store's end).
            let Some((key, on)) = changes.recv().await else {
                return;
            };
            if on {
                channels.insert(names.channel(key.as_ref()), key);
            }
            continue;
        }
        attempt += 1;
        let listened = match conn.pubsub_client(attempt - 1).await {
            Ok(client) => {
                let to = (&conn, &client);
                listen(to, &names, &mut channels, &wakes, &mut changes).await
            }
            Err(error) => Err(error),
        };
        match listened {
            Ok(()) => return,
            Err(error) => {
                if let Some(wakes) = wakes.upgrade() {
                    wakes.heard(None, false);
                }
                tracing::debug!(%error, "the subscription to releases broke; remaking it");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

/// Sets (or keeps alive) the markers of `keys`, where the store has them.
async fn mark<'a>(
    conn: &Conn,
    marker_of: Option<&Marker>,
    keys: impl Iterator<Item = &'a Option<Arc<str>>>,
) -> redis::RedisResult<()> {
    let Some(marker_of) = marker_of else {
        return Ok(());
    };
    let sets = keys.flatten().map(|key| {
        let (mut conn, mut set) = (conn.clone(), redis::cmd("SET"));
        set.arg(marker_of(key)).arg(1).arg("PX").arg(MARK_MS);
        async move { set.query_async::<()>(&mut conn).await }
    });
    let all = futures_util::future::join_all(sets);
    within(async { all.await.into_iter().collect::<redis::RedisResult<()>>() }).await
}

/// Subscribes to `channels` and wakes their keys' waiters, until the subscription breaks (an error) or
/// the store goes (`Ok`).
async fn listen<F: Fn(&str) -> String>(
    (conn, client): (&Conn, &Client),
    names: &Names<F>,
    channels: &mut Channels,
    wakes: &Weak<Wakes>,
    changes: &mut Changes,
) -> redis::RedisResult<()> {
    let marker_of = names.marker_of.as_ref();
    let (mut sink, mut messages) = within(client.get_async_pubsub()).await?.split();
    for channel in channels.keys() {
        within(sink.subscribe(channel)).await?;
    }
    mark(conn, marker_of, channels.values()).await?;
    let mut keep_marks =
        tokio::time::interval_at(tokio::time::Instant::now() + MARK_EVERY, MARK_EVERY);
    keep_marks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Releases made while no subscription was listening went unheard: every waiter checks again.
    match wakes.upgrade() {
        Some(wakes) => {
            wakes.heard(None, true);
            wakes.wake_all();
        }
        None => return Ok(()),
    }
    loop {
        tokio::select! {
            message = messages.next() => {
                let Some(message) = message else {
                    return Err(redis::RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        "the subscription to releases ended",
                    )));
                };
                let (Some(topic), Some(wakes)) = (channels.get(message.get_channel_name()), wakes.upgrade()) else {
                    continue;
                };
                match topic {
                    Some(key) => wakes.wake(key),
                    None => wakes.wake_turns(&message.get_payload::<String>().unwrap_or_default()),
                }
            }
            _ = keep_marks.tick(), if marker_of.is_some() => {
                mark(conn, marker_of, channels.values()).await?;
            }
            change = changes.recv() => {
                let Some((key, on)) = change else { return Ok(()) };
                let channel = names.channel(key.as_ref());
                if on {
                    // Kept first: a subscription that fails here is made when it is remade.
                    channels.insert(channel.clone(), key.clone());
                    within(sink.subscribe(&channel)).await?;
                    // Marked before the waiters hear that releases are heard: they ask again after.
                    mark(conn, marker_of, std::iter::once(&key)).await?;
                    match (wakes.upgrade(), &key) {
                        (Some(wakes), Some(key)) => wakes.heard(Some(key), true),
                        (Some(wakes), None) => wakes.turns_heard(),
                        (None, _) => {}
                    }
                } else {
                    channels.remove(&channel);
                    within(sink.unsubscribe(&channel)).await?;
                }
            }
        }
    }
}
