//! Wake-ups for waiters on Redis: every release publishes on its key's channel (`batch.lua`,
//! `dify.lua`), and each store handle subscribes to the channels of the keys its waiters wait on, over
//! a connection of its own, opened at the first interest.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::Client;
use tokio::sync::mpsc;

use super::dify::Layout;
use super::keys::KeyNames;
use super::overrides::within;
use crate::store::wake::Wakes;

/// How long to wait before subscribing again after the subscription broke.
const RETRY: Duration = Duration::from_millis(100);

/// The channel a release on `key` is announced on (`scripts/batch.lua`, `scripts/dify.lua`).
pub(super) fn channel(layout: Layout, prefix: &str, key: &str) -> String {
    match layout {
        Layout::Dify => format!("{{dify:rate_limit:{key}:active_requests}}:released"),
        _ => format!("{}:released", KeyNames::new(prefix, key).tag()),
    }
}

/// The wake-ups of a store, and the task that keeps its subscriptions; it ends with the store.
pub(super) fn start(client: Client, layout: Layout, prefix: &str) -> Arc<Wakes> {
    let (changes, wanted) = mpsc::unbounded_channel();
    let wakes = Arc::new(Wakes::with_hook(Box::new(move |key, on| {
        let _ = changes.send((key.clone(), on));
    })));
    let prefix = prefix.to_owned();
    let channel_of = move |key: &str| channel(layout, &prefix, key);
    tokio::spawn(follow(client, channel_of, Arc::downgrade(&wakes), wanted));
    wakes
}

type Changes = mpsc::UnboundedReceiver<(Arc<str>, bool)>;

async fn follow(
    client: Client,
    channel_of: impl Fn(&str) -> String,
    wakes: Weak<Wakes>,
    mut changes: Changes,
) {
    // Channel -> key, for every key with an interest.
    let mut channels: HashMap<String, Arc<str>> = HashMap::new();
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
        match listen(&client, &channel_of, &mut channels, &wakes, &mut changes).await {
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
