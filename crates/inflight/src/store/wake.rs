//! Waiters' tickets: a store that keeps one queue per key for every process sharing it gives each waiter a
//! ticket, and wakes it when its turn comes (a release, a new limit, the ticket ahead leaving), so that a
//! waiter asks again at once instead of polling.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::Store;

/// A store whose waiters take tickets: what [`crate::Limiter::acquire`] needs beyond [`Store`]. A store
/// that gives none ([`Wakeups::ticket`] is `None`, the default) has its waiters ask again on a short,
/// bounded interval.
pub trait Wakeups: Store {
    /// A ticket for one waiter, where the store keeps one queue per key for every process sharing it:
    /// its name goes in [`AcquireRequest::ticket`](crate::store::AcquireRequest::ticket), and the store
    /// wakes it when its turn comes. `None`: the store has no such queues.
    fn ticket(&self) -> Option<Turn> {
        None
    }

    /// How many tickets of other waiters this handle's admissions found expired (their processes
    /// stopped renewing them: killed, paused, cut off), since it was made.
    fn tickets_expired(&self) -> u64 {
        0
    }

    /// Gives up `ticket`'s place in the queues of `keys` (a waiter that stops waiting unadmitted);
    /// whether it held one. With `handed`, the waiter's id: a lease a release handed it
    /// ([`Ticket::handoff`](crate::store::Ticket::handoff)) before it heard is released.
    fn leave(
        &self,
        keys: &[Arc<str>],
        ticket: &str,
        handed: Option<&crate::id::PermitId>,
    ) -> impl std::future::Future<Output = Result<bool, crate::error::StoreError>> + Send {
        let _ = (keys, ticket, handed);
        std::future::ready(Ok(false))
    }
}

/// Subscribes to the store's turns (Redis): called once, at the first ticket.
pub(crate) type Hook = Box<dyn Fn() + Send + Sync>;

/// A slot a release handed a ticket ([`crate::store::Ticket::handoff`]): the lease recorded for its
/// waiter, and the key's limit and in-flight count then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handed {
    /// The token of the lease.
    pub token: u64,
    /// When the lease ends unless renewed (the store's clock, ms).
    pub expires_at_ms: u64,
    /// The key's limit then.
    pub limit: u32,
    /// The key's in-flight count then, this lease's weight included.
    pub in_flight: u32,
}

impl Handed {
    #[cfg(feature = "redis")]
    /// `token:expires_at_ms:limit:in_flight`, as `queue.lua` publishes it.
    fn parse(text: &str) -> Option<Self> {
        let mut numbers = text.split(':').map(str::parse::<u64>);
        let mut next = || numbers.next()?.ok();
        let (token, expires_at_ms, limit, in_flight) = (next()?, next()?, next()?, next()?);
        Some(Handed {
            token,
            expires_at_ms,
            limit: u32::try_from(limit).ok()?,
            in_flight: u32::try_from(in_flight).ok()?,
        })
    }
}

/// A ticket's wake-up, and the slot a release handed it if one did, or its revocation.
#[derive(Default)]
struct Called {
    notify: Notify,
    handed: Mutex<Option<Handed>>,
    revoked: AtomicBool,
}

impl Called {
    fn call(&self, handed: Option<Handed>) {
        if handed.is_some() {
            *self.handed.lock().unwrap_or_else(|e| e.into_inner()) = handed;
        }
        self.notify.notify_one();
    }

    fn revoke(&self) {
        self.revoked.store(true, Ordering::Release);
        self.notify.notify_one();
    }
}

/// The tickets of one store handle and their wake-ups.
#[derive(Default)]
pub(crate) struct Wakes {
    hook: Option<Hook>,
    /// The tickets' channel; a ticket is named `<channel>#<n>`.
    channel: String,
    turns: Mutex<HashMap<u64, Arc<Called>>>,
    next_turn: AtomicU64,
    /// Whether turns are heard now (the channel's subscription is in force).
    turns_heard: AtomicBool,
    turns_subscribed: Notify,
    /// Set at the first ticket: the turns' subscription is asked for once, and kept.
    turns_wanted: AtomicBool,
    tickets_expired: AtomicU64,
}

impl Wakes {
    #[cfg(feature = "redis")]
    /// Wakes whose tickets are named after `channel`, where their turns are heard once `hook` has
    /// subscribed to it ([`Wakes::turns_heard`]).
    pub(crate) fn with_tickets(hook: Hook, channel: String) -> Self {
        Self {
            hook: Some(hook),
            channel,
            ..Self::default()
        }
    }

    /// Wakes of an in-process store, whose tickets are woken by the store itself.
    pub(crate) fn local_tickets() -> Self {
        Self {
            channel: "local".to_owned(),
            turns_heard: AtomicBool::new(true),
            ..Self::default()
        }
    }

    /// Wakes the tickets named (`<channel>#<n>`), with the slot handed to each, if any.
    pub(crate) fn wake_tickets(&self, called: &[(Arc<str>, Option<Handed>)]) {
        if called.is_empty() {
            return;
        }
        let turns = self.turns();
        for (name, handed) in called {
            if let Some(turn) = turn_of(name).and_then(|n| turns.get(&n)) {
                turn.call(*handed);
            }
        }
    }

    /// Tells the waiter of the ticket named (`<channel>#<n>`) that an admin revoked it.
    pub(crate) fn revoke_ticket(&self, name: &str) {
        if let Some(turn) = turn_of(name).and_then(|n| self.turns().get(&n).cloned()) {
            turn.revoke();
        }
    }

    fn turns(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Called>>> {
        self.turns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new ticket.
    pub(crate) fn ticket(self: &Arc<Self>) -> Turn {
        let n = self.next_turn.fetch_add(1, Ordering::Relaxed);
        let called = Arc::new(Called::default());
        self.turns().insert(n, called.clone());
        if !self.turns_wanted.swap(true, Ordering::AcqRel) {
            if let Some(hook) = &self.hook {
                hook();
            }
        }
        Turn {
            wakes: self.clone(),
            n,
            name: format!("{}#{n}", self.channel),
            called,
        }
    }

    /// Counts `n` tickets found expired (a negative or zero `n`: none).
    pub(crate) fn count_expired(&self, n: i64) {
        if let Ok(n @ 1..) = u64::try_from(n) {
            self.tickets_expired.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub(crate) fn tickets_expired(&self) -> u64 {
        self.tickets_expired.load(Ordering::Relaxed)
    }

    #[cfg(feature = "redis")]
    /// Wakes the tickets a message on the channel names (`<n> <n2>=<handed> <n3>! ...`, see `queue.lua`;
    /// `!`: revoked).
    pub(crate) fn wake_turns(&self, message: &str) {
        let turns = self.turns();
        for called in message.split(' ') {
            if let Some(n) = called.strip_suffix('!') {
                if let Some(turn) = n.parse::<u64>().ok().and_then(|n| turns.get(&n)) {
                    turn.revoke();
                }
                continue;
            }
            let (n, handed) = match called.split_once('=') {
                Some((n, handed)) => (n, Handed::parse(handed)),
                None => (called, None),
            };
            if let Some(turn) = n.parse::<u64>().ok().and_then(|n| turns.get(&n)) {
                turn.call(handed);
            }
        }
    }

    #[cfg(feature = "redis")]
    /// Turns are heard from now on (`true`: the channel's subscription is in force), or are not (it
    /// broke). Heard again, every ticket asks again: a turn called meanwhile went unheard.
    pub(crate) fn turns_heard(&self, heard: bool) {
        self.turns_heard.store(heard, Ordering::Release);
        if heard {
            self.turns_subscribed.notify_waiters();
            for turn in self.turns().values() {
                turn.notify.notify_one();
            }
        }
    }

    /// (The turns' subscription stays once made: unsubscribing between two waits, and subscribing
    /// again, would leave a moment in which a turn goes unheard, and cost two commands a wait.)
    fn drop_turn(&self, n: u64) {
        self.turns().remove(&n);
    }
}

/// The number of the ticket named `<channel>#<n>`.
fn turn_of(name: &str) -> Option<u64> {
    name.rsplit('#').next()?.parse().ok()
}

/// One waiter's ticket: its name, and its wake-up when its turn comes; dropping it ends the wake-up (the
/// waiter gives up its place in the store with [`Wakeups::leave`]).
pub struct Turn {
    wakes: Arc<Wakes>,
    n: u64,
    name: String,
    called: Arc<Called>,
}

impl Turn {
    /// The ticket's name, unique among the store's waiters.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Completes at the ticket's next turn, or at once if one came since the last (a wake-up is kept).
    pub async fn called(&self) {
        self.called.notify.notified().await;
    }

    /// The slot a release handed this ticket, if one did since the last call.
    pub fn handed(&self) -> Option<Handed> {
        self.called
            .handed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// True when an admin revoked the ticket ([`crate::store::Holders::revoke_waiter`]): its waiter
    /// stops waiting.
    pub fn is_revoked(&self) -> bool {
        self.called.revoked.load(Ordering::Acquire)
    }

    /// True when turns are heard now (the store's subscription is in force).
    pub fn is_heard(&self) -> bool {
        self.wakes.turns_heard.load(Ordering::Acquire)
    }

    /// Completes once turns are heard (the store's subscription is in force). Bound it with a timeout.
    pub async fn heard(&self) {
        loop {
            let subscribed = self.wakes.turns_subscribed.notified();
            tokio::pin!(subscribed);
            subscribed.as_mut().enable();
            if self.wakes.turns_heard.load(Ordering::Acquire) {
                return;
            }
            subscribed.await;
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.wakes.drop_turn(self.n);
    }
}

impl std::fmt::Debug for Turn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turn").field("name", &self.name).finish()
    }
}
