//! The status page's one task per worker: each second it samples the counters into the ring and, while
//! a page is watching, lists the busy keys (timed: the store's health and latency) and publishes what the
//! pages show; at once when a new page connects.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use inflight::{Clock, Store, StoreError, SystemClock};
use serde::Serialize;
use tokio::sync::watch;

use super::board::Board;
use crate::api::BusyJson;

const PAGE_KEYS: usize = 20;

/// How long one look at the store may take before the page says it is unavailable.
const STORE_TIMEOUT: Duration = Duration::from_secs(2);

/// What a page is sent, as JSON in each event.
#[derive(Serialize)]
struct Snapshot {
    /// When, in ms since the Unix epoch.
    at_ms: u64,
    /// The busiest keys (none when the store cannot list them; see `store.listing`).
    #[serde(flatten)]
    busy: BusyJson,
    per_minute: PerMinute,
    store: Health,
}

#[derive(Serialize)]
struct PerMinute {
    admitted: u64,
    refused: u64,
    reclaimed: u64,
    /// Admitted past a shadow limit (watched, not enforced).
    shadowed: u64,
}

#[derive(Serialize)]
struct Health {
    ok: bool,
    latency_ms: f64,
    /// Why the store did not answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// False when the store cannot list busy keys (Dify's layout): only its health is shown.
    listing: bool,
}

/// Runs until the worker stops (or its board is gone).
pub(super) async fn run(board: Weak<Board>, mut stopping: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let Some(wake) = board.upgrade().map(|board| board.wake.clone()) else {
        return;
    };
    loop {
        let sampled = tokio::select! {
            _ = tick.tick() => true,
            () = wake.notified() => false,
            _ = stopping.wait_for(|stop| *stop) => return,
        };
        let Some(board) = board.upgrade() else { return };
        if sampled {
            let (admitted, refused) = board.metrics.admissions();
            let reclaimed = board.limiter.stats().reclaimed.load(Ordering::Relaxed);
            let shadowed = board.metrics.shadow_refusals();
            board
                .ring()
                .sample([admitted, refused, reclaimed, shadowed]);
        }
        if board.snapshot.receiver_count() > 0 {
            let snapshot = snapshot(&board).await;
            let json = serde_json::to_string(&snapshot).unwrap_or_default();
            board.snapshot.send_replace(Arc::from(json));
        }
    }
}

async fn snapshot(board: &Board) -> Snapshot {
    let [admitted, refused, reclaimed, shadowed] = board.ring().per_minute();
    let started = Instant::now();
    let listed = tokio::time::timeout(STORE_TIMEOUT, board.limiter.busy("", PAGE_KEYS)).await;
    let listed = listed.unwrap_or_else(|_| Err(StoreError::Unavailable("timed out".into())));
    let (busy, store) = match listed {
        Ok(busy) => (busy.into(), health(started, None, true)),
        Err(StoreError::Unsupported(why)) => {
            // Its health, then, from the cheapest call there is.
            let started = Instant::now();
            let maintained =
                tokio::time::timeout(STORE_TIMEOUT, board.limiter.store().maintain()).await;
            let error = match maintained {
                Ok(Ok(())) => None,
                Ok(Err(error)) => Some(error.to_string()),
                Err(_) => Some("timed out".to_owned()),
            };
            tracing::debug!(%why, "the status page lists no busy keys");
            (
                inflight::Busiest::default().into(),
                health(started, error, false),
            )
        }
        Err(error) => (
            inflight::Busiest::default().into(),
            health(started, Some(error.to_string()), true),
        ),
    };
    Snapshot {
        at_ms: SystemClock.now_ms(),
        busy,
        per_minute: PerMinute {
            admitted,
            refused,
            reclaimed,
            shadowed,
        },
        store,
    }
}

fn health(started: Instant, error: Option<String>, listing: bool) -> Health {
    Health {
        ok: error.is_none(),
        latency_ms: (started.elapsed().as_secs_f64() * 1e6).round() / 1e3,
        error,
        listing,
    }
}
