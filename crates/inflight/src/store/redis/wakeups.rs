//! Wake-ups for waiters on Redis: every release publishes on its key's channel (named by the store:
//! `batch.lua`, `dify.lua`), and each store handle subscribes to the channels of the keys its waiters
//! wait on, over a connection of its own, opened at the first interest.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::Client;
use tokio::sync::mpsc;

use super::connect::Conn;
use super::keeper::within;
use crate::store::wake::Wakes;

/// How long to wait before subscribing again after the subscription broke.
const RETRY: Duration = Duration::from_millis(100);

/// The wake-ups of a store whose releases on a key are announced on `channel_of(key)`, and the task
/// that keeps its subscriptions; it ends with the store.
pub(super) fn start(
    conn: Conn,
    channel_of: impl Fn(&str) -> String + Send + Sync + 'static,
) -> Arc<Wakes> {
    let (changes, wanted) = mpsc::unbounded_channel();
    let wakes = Arc::new(Wakes::with_hook(Box::new(move |key, on| {
        let _ = changes.send((key.clone(), on));
    })));
    tokio::spawn(follow(conn, channel_of, Arc::downgrade(&wakes), wanted));
    wakes
}

type Changes = mpsc::UnboundedReceiver<(Arc<str>, bool)>;

async fn follow(
    conn: Conn,
    channel_of: impl Fn(&str) -> String,
    wakes: Weak<Wakes>,
    mut changes: Changes,
) {
    // Channel -> key, for every key with an interest.
    let mut channels: HashMap<String, Arc<str>> = HashMap::new();
    // Which node (of a cluster's: PUBLISH reaches them all) to subscribe through: the next after a failure.
    let mut attempt = 0;
    loop {
        if channels.is_empty() {
            // Nothing to hear until a first interest (or the store's end).
            let Some((key, on)) = changes.recv().await else {
                return;
            };
            if on {
                channels.insert(channel_of(&key), key);
            }
            continue;
        }
        attempt += 1;
        let listened = match conn.pubsub_client(attempt - 1).await {
            Ok(client) => listen(&client, &channel_of, &mut channels, &wakes, &mut changes).await,
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

/// Subscribes to `channels` and wakes their keys' waiters, until the subscription breaks (an error) or
/// the store goes (`Ok`).
async fn listen(
    client: &Client,
    channel_of: &impl Fn(&str) -> String,
    channels: &mut HashMap<String, Arc<str>>,
    wakes: &Weak<Wakes>,
    changes: &mut Changes,
) -> redis::RedisResult<()> {
    let (mut sink, mut messages) = within(client.get_async_pubsub()).await?.split();
    for channel in channels.keys() {
        within(sink.subscribe(channel)).await?;
    }
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
                let (Some(key), Some(wakes)) = (channels.get(message.get_channel_name()), wakes.upgrade()) else {
                    continue;
                };
                wakes.wake(key);
            }
            change = changes.recv() => {
                let Some((key, on)) = change else { return Ok(()) };
                let channel = channel_of(&key);
                if on {
                    // Kept first: a subscription that fails here is made when it is remade.
                    channels.insert(channel.clone(), key.clone());
                    within(sink.subscribe(&channel)).await?;
                    if let Some(wakes) = wakes.upgrade() {
                        wakes.heard(Some(&key), true);
                    }
                } else {
                    channels.remove(&channel);
                    within(sink.unsubscribe(&channel)).await?;
                }
            }
        }
    }
}
