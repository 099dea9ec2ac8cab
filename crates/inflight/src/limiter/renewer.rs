//! The renewal task: renews the leases of live permits in batches, extends the reservations held in this
//! process, and runs store maintenance. One task per limiter, not one per permit or reservation;
//! [`Registry`] is what it renews.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::core::Core;
use super::registry::{Registry, MAX_TICK};
use super::standing::TICKET_LEASE_MS;
use crate::permit::PermitState;
use crate::store::{RenewRequest, Renewal, Store};

/// How many leases one store call renews.
const BATCH: usize = 512;

/// Runs until the limiter and all its permits are gone.
pub(super) async fn run<S: Store>(core: Weak<Core<S>>) {
    let mut last_maintain = Instant::now();
    let Some(shorter) = core.upgrade().map(|core| core.registry.shorter.clone()) else {
        return;
    };
    loop {
        let tick = match core.upgrade() {
            Some(core) => core.registry.tick(),
            None => return,
        };
        tokio::select! {
            () = tokio::time::sleep(tick) => {}
            () = shorter.notified() => continue,
        }
        let Some(core) = core.upgrade() else { return };
        let now = core.registry.now_ms();
        core.registry.coarse_now_ms.store(now, Ordering::Relaxed);
        renew_due(&core, now).await;
        if last_maintain.elapsed() >= MAX_TICK {
            let _ = core.store.maintain().await;
            if let Some(fallback) = &core.fallback {
                let _ = fallback.maintain().await;
            }
            last_maintain = Instant::now();
        }
    }
}

/// Renews every lease whose renewal is due by `now` (limiter clock), in batches.
pub(super) async fn renew_due<S: Store>(core: &Core<S>, now: u64) {
    extend_due(&core.registry, now).await;
    let due = core.registry.due(now, core.lease_ms);
    for chunk in due.chunks(BATCH) {
        let batch: Vec<RenewRequest> = chunk
            .iter()
            .map(|p| RenewRequest {
                keys: p.keys.clone(),
                id: p.id.clone(),
                lease_ms: Some(p.lease_ms),
                limits: core.limits_of(&p.keys),
                readd_weight: Some(p.weight),
                token: p.token.load(Ordering::Acquire),
                counted: p.counted,
            })
            .collect();
        let outcomes = match core.store.renew(&batch).await {
            Ok(outcomes) => outcomes,
            Err(error) => {
                // Left due: the next pass tries again, and the lease re-adds itself once the store is back.
                tracing::warn!(%error, permits = batch.len(), "lease renewal failed");
                return;
            }
        };
        for (permit, outcome) in chunk.iter().zip(outcomes) {
            apply(core, permit, outcome);
        }
    }
}

/// Claims a lease a release handed a waiter (`Ticket::handoff`), off the waiter's path: the store
/// recorded it for as long as the waiter's ticket would have lasted (a dead waiter's holds its slot no
/// longer), and this renews it to its own length a third of the way through, as a renewal would (a
/// permit released by then, as most waited ones are, costs the store nothing more). Never re-added: a
/// lease released (here or by the holder it was detached to) before the claim arrives stays released.
/// Failing, it is due at once for the renewal task's next pass.
pub(super) fn claim<S: Store>(core: &Arc<Core<S>>, permit: Arc<PermitState>) {
    // (Not kept alive meanwhile: a limiter dropped before then has nothing to claim for.)
    let core = Arc::downgrade(core);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(TICKET_LEASE_MS / 3)).await;
        let Some(core) = core.upgrade() else { return };
        if permit.released.load(Ordering::Acquire) {
            return;
        }
        let request = RenewRequest {
            keys: permit.keys.clone(),
            id: permit.id.clone(),
            lease_ms: Some(permit.lease_ms),
            limits: core.limits_of(&permit.keys),
            readd_weight: None,
            token: permit.token.load(Ordering::Acquire),
            counted: permit.counted,
        };
        match core.store.renew(std::slice::from_ref(&request)).await {
            // (Lost once detached: its holder released it first, nothing this process holds.)
            Ok(mut outcomes) => match outcomes.pop() {
                Some(Renewal::Lost) if permit.holders.load(Ordering::Acquire) == 0 => {}
                Some(outcome) => apply(&core, &permit, outcome),
                None => {}
            },
            Err(error) => {
                tracing::warn!(%error, "claiming a handed lease failed");
                permit.renew_at_ms.store(0, Ordering::Relaxed);
            }
        }
    });
}

/// Extends every reservation kept open whose extension is due by `now` (limiter clock), together.
async fn extend_due(registry: &Registry, now: u64) {
    let due: Vec<_> = registry
        .kept
        .iter()
        .filter(|kept| kept.renew_at_ms.load(Ordering::Relaxed) <= now)
        .map(|kept| (*kept.key(), kept.value().clone()))
        .collect();
    let extensions = due.iter().map(|(_, kept)| (kept.extend)());
    let outcomes = futures_util::future::join_all(extensions).await;
    for ((number, kept), outcome) in due.into_iter().zip(outcomes) {
        let (key, id) = (&kept.key, &kept.id);
        let next = match outcome {
            Ok(true) => kept.ttl_ms / 3,
            Ok(false) => {
                // (Settled as the extension left: it is no longer kept, and nothing is wrong.)
                if registry.kept.remove(&number).is_some() {
                    tracing::warn!(%key, %id, "a held reservation was no longer open: it expired (refunded) before it was settled");
                }
                continue;
            }
            Err(error) => {
                // Sooner after a failure: a third of the ttl twice more would let it expire while held.
                tracing::warn!(%error, %key, %id, "a held reservation was not extended; trying again");
                kept.ttl_ms / 10
            }
        };
        kept.renew_at_ms
            .store(now.saturating_add(next.max(1)), Ordering::Relaxed);
    }
}

fn apply<S: Store>(core: &Core<S>, permit: &Arc<PermitState>, outcome: Renewal) {
    match outcome {
        Renewal::Renewed(grant) | Renewal::Readded(grant) => {
            permit
                .expires_at_ms
                .store(grant.expires_at_ms, Ordering::Relaxed);
            permit
                .renew_at_ms
                .store(core.registry.renew_at(permit.lease_ms), Ordering::Relaxed);
            if matches!(outcome, Renewal::Readded(_)) {
                core.stats.readded.fetch_add(1, Ordering::Relaxed);
                tracing::info!(key = %permit.keys[0], id = %permit.id, "lease was gone and has been re-added");
            }
            // A permit released while its renewal was on its way must not leave the lease behind, unless
            // another permit of this process holds the same lease since.
            if permit.released.load(Ordering::Acquire) && !core.registry.holds_other(permit) {
                core.settler.settle(core.release_state(permit));
            }
        }
        Renewal::Lost => {
            permit.lost.set();
            if !permit.released.load(Ordering::Acquire) {
                core.stats.lost.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(key = %permit.keys[0], id = %permit.id, "lease lost: revoked, or gone with the key full without it");
            }
            core.registry.forget(permit);
        }
    }
}
