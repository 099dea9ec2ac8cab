//! Turns for waiters on Redis: a script that frees room in a key's queue (`queue.lua`) publishes the
//! turns it calls on the channel of each ticket's store handle. A handle subscribes to its channel, over
//! a connection of its own, at its first ticket, and keeps the subscription while the store lives.

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::connect::Conn;
use super::keeper::within;
use crate::store::wake::{Hook, Wakes};

/// How long to wait before subscribing again after the subscription broke.
const RETRY: Duration = Duration::from_millis(100);

/// The wake-ups of a store handle whose tickets' turns are published on `channel`, and the task that
/// keeps the subscription; it ends with the store.
pub(super) fn start(conn: Conn, channel: String) -> Arc<Wakes> {
    let (wanted, first) = mpsc::unbounded_channel();
    let hook: Hook = Box::new(move || {
        let _ = wanted.send(());
    });
    let wakes = Arc::new(Wakes::with_tickets(hook, channel.clone()));
    tokio::spawn(follow(conn, channel, Arc::downgrade(&wakes), first));
    wakes
}

async fn follow(
    conn: Conn,
    channel: String,
    wakes: Weak<Wakes>,
    mut first: mpsc::UnboundedReceiver<()>,
) {
    // Nothing to hear until a first ticket (or the store's end).
    if first.recv().await.is_none() {
        return;
    }
    // Which node (of a cluster's: PUBLISH reaches them all) to subscribe through: the next after a failure.
    let mut attempt = 0;
    loop {
        attempt += 1;
        let listened = match conn.pubsub_client(attempt - 1).await {
            Ok(client) => listen(&client, &channel, &wakes, &mut first).await,
            Err(error) => Err(error),
        };
        let Some(alive) = wakes.upgrade() else { return };
        let Err(error) = listened else { return };
        alive.turns_heard(false);
        drop(alive);
        tracing::debug!(%error, "the subscription to turns broke; remaking it");
        tokio::time::sleep(RETRY).await;
    }
}

/// Subscribes to `channel` and wakes the tickets its messages name, until the subscription breaks (an
/// error) or the store goes (`Ok`: `gone` ends with it).
async fn listen(
    client: &redis::Client,
    channel: &str,
    wakes: &Weak<Wakes>,
    gone: &mut mpsc::UnboundedReceiver<()>,
) -> redis::RedisResult<()> {
    let mut pubsub = within(client.get_async_pubsub()).await?;
    within(pubsub.subscribe(channel)).await?;
    let mut messages = pubsub.into_on_message();
    // Turns called while no subscription was listening went unheard: every ticket asks again.
    match wakes.upgrade() {
        Some(wakes) => wakes.turns_heard(true),
        None => return Ok(()),
    }
    loop {
        let message = tokio::select! {
            message = messages.next() => message,
            more = gone.recv() => match more {
                Some(()) => continue,
                None => return Ok(()),
            },
        };
        let Some(message) = message else {
            return Err(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "the subscription to turns ended",
            )));
        };
        let Some(wakes) = wakes.upgrade() else {
            return Ok(());
        };
        wakes.wake_turns(&message.get_payload::<String>().unwrap_or_default());
    }
}
