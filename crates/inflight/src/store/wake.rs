//! Wake-ups for waiting admissions: a store that says when a key's slots are freed (by a release in this
//! process or, on Redis, in any other) lets a waiter try again at once instead of polling.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::futures::Notified;
use tokio::sync::Notify;

use super::Store;

/// A store that tells waiters when a key's slots are freed: what [`crate::Limiter::acquire`] needs
/// beyond [`Store`].
pub trait Wakeups: Store {
    /// Hears of releases on `key` for as long as the returned interest lives. A wake-up may be lost (a
    /// dropped subscription), so a waiter also checks again now and then.
    fn interest(&self, key: &str) -> Interest;

    /// A ticket for one waiter, where the store keeps one queue per key for every process sharing it
    /// (Redis): its name goes in [`AcquireRequest::ticket`](crate::store::AcquireRequest::ticket), and
    /// the store wakes it when its turn comes. `None`: the store has no such queues.
    fn ticket(&self) -> Option<Turn> {
        None
    }

    /// How many tickets of other waiters this handle's admissions found expired (their processes
    /// stopped renewing them: killed, paused, cut off), since it was made.
    fn tickets_expired(&self) -> u64 {
        0
    }

    /// Gives up `ticket`'s place in the queues of `keys` (a waiter that stops waiting unadmitted);
    /// whether it held one.
    fn leave(
        &self,
        keys: &[Arc<str>],
        ticket: &str,
    ) -> impl std::future::Future<Output = Result<bool, crate::error::StoreError>> + Send {
        let _ = (keys, ticket);
        std::future::ready(Ok(false))
    }
}

/// What a [`Hook`] is told of.
pub(crate) enum Topic<'a> {
    /// A key's releases.
    Key(&'a Arc<str>),
    /// The turns of this store's tickets.
    Turns,
}

/// Subscribes to or unsubscribes from a key's releases, or the store's turns (Redis): called with
/// `true` for the first interest in one, `false` when its last interest goes.
pub(crate) type Hook = Box<dyn Fn(Topic<'_>, bool) + Send + Sync>;

/// A key's wake-ups: of releases, and of its subscription being in force (Redis).
pub(crate) struct Watch {
    released: Notify,
    /// Whether releases on the key are heard now: always in memory; on Redis once subscribed.
    heard: AtomicBool,
    subscribed: Notify,
}

/// A key's wake-ups, and how many interests it has.
type Watched = (Arc<Watch>, usize);

/// The interests of one store in the keys that waiters wait on: a wake-up per key, counted; and the
/// wake-ups of its tickets.
#[derive(Default)]
pub(crate) struct Wakes {
    keys: Mutex<HashMap<Arc<str>, Watched>>,
    /// How many keys have an interest: a release checks this before taking the lock.
    watched: AtomicUsize,
    hook: Option<Hook>,
    /// The tickets' channel (`None`: no tickets); a ticket is named `<channel>#<n>`.
    channel: Option<String>,
    turns: Mutex<HashMap<u64, Arc<Notify>>>,
    next_turn: AtomicU64,
    /// Whether turns are heard now (the channel's subscription is in force).
    turns_heard: AtomicBool,
    turns_subscribed: Notify,
    /// Set at the first ticket: the turns' subscription is asked for once, and kept.
    turns_wanted: AtomicBool,
    tickets_expired: AtomicU64,
}

impl Wakes {
    /// Wakes told of the first and last interest in each key; a key's releases are heard once
    /// [`Wakes::heard`] says so.
    pub(crate) fn with_hook(hook: Hook) -> Self {
        Self {
            hook: Some(hook),
            ..Self::default()
        }
    }

    /// Wakes that also give tickets, named after `channel`, where their turns are heard.
    pub(crate) fn with_tickets(hook: Hook, channel: String) -> Self {
        Self {
            hook: Some(hook),
            channel: Some(channel),
            ..Self::default()
        }
    }

    /// Wakes of an in-process store, whose tickets are woken by the store itself.
    pub(crate) fn local_tickets() -> Self {
        Self {
            channel: Some("local".to_owned()),
            turns_heard: AtomicBool::new(true),
            ..Self::default()
        }
    }

    /// Wakes the tickets named (`<channel>#<n>`).
    pub(crate) fn wake_tickets(&self, names: &[Arc<str>]) {
        if names.is_empty() {
            return;
        }
        let turns = self.turns();
        for name in names {
            let n = name.rsplit('#').next().and_then(|n| n.parse::<u64>().ok());
            if let Some(turn) = n.and_then(|n| turns.get(&n)) {
                turn.notify_one();
            }
        }
    }

    fn turns(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Notify>>> {
        self.turns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A ticket, if these wakes give them.
    pub(crate) fn ticket(self: &Arc<Self>) -> Option<Turn> {
        let channel = self.channel.as_ref()?;
        let n = self.next_turn.fetch_add(1, Ordering::Relaxed);
        let notify = Arc::new(Notify::new());
        let mut turns = self.turns();
        turns.insert(n, notify.clone());
        if !self.turns_wanted.swap(true, Ordering::AcqRel) {
            if let Some(hook) = &self.hook {
                hook(Topic::Turns, true);
            }
        }
        Some(Turn {
            wakes: self.clone(),
            n,
            name: format!("{channel}#{n}"),
            notify,
        })
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

    /// Wakes the tickets a message on the channel names (`<n> <n2> ...`).
    pub(crate) fn wake_turns(&self, message: &str) {
        let turns = self.turns();
        for n in message.split(' ').filter_map(|n| n.parse::<u64>().ok()) {
            if let Some(turn) = turns.get(&n) {
                turn.notify_one();
            }
        }
    }

    /// Turns are heard from now on (the channel's subscription is in force).
    pub(crate) fn turns_heard(&self) {
        self.turns_heard.store(true, Ordering::Release);
        self.turns_subscribed.notify_waiters();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Watched>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An interest in `key`.
    pub(crate) fn interest(self: &Arc<Self>, key: &str) -> Interest {
        let mut keys = self.lock();
        let known = keys.get_mut(key).map(|(watch, count)| {
            *count += 1;
            watch.clone()
        });
        let (key, watch) = match known {
            Some(watch) => {
                let known = keys.get_key_value(key).map(|(known, _)| known.clone());
                (known.unwrap_or_else(|| Arc::from(key)), watch)
            }
            None => {
                let key: Arc<str> = Arc::from(key);
                let watch = Arc::new(Watch {
                    released: Notify::new(),
                    heard: AtomicBool::new(self.hook.is_none()),
                    subscribed: Notify::new(),
                });
                keys.insert(key.clone(), (watch.clone(), 1));
                self.watched.fetch_add(1, Ordering::Relaxed);
                if let Some(hook) = &self.hook {
                    hook(Topic::Key(&key), true);
                }
                (key, watch)
            }
        };
        Interest {
            wakes: self.clone(),
            key,
            watch,
        }
    }

    /// Releases on `key` are heard from now on (its subscription is in force), or are not (`false`:
    /// every key, its subscription broke).
    pub(crate) fn heard(&self, key: Option<&str>, heard: bool) {
        if key.is_none() && !heard {
            self.turns_heard.store(false, Ordering::Release);
        }
        if key.is_none() && heard && self.turns_wanted.load(Ordering::Acquire) {
            self.turns_heard();
        }
        let keys = self.lock();
        let watches = match key {
            Some(key) => keys.get(key).into_iter().collect::<Vec<_>>(),
            None => keys.values().collect(),
        };
        for (watch, _) in watches {
            watch.heard.store(heard, Ordering::Release);
            if heard {
                watch.subscribed.notify_waiters();
            }
        }
    }

    /// Wakes every waiter on `key` (those that have enabled their wait; see [`Interest::notified`]).
    #[inline]
    pub(crate) fn wake(&self, key: &str) {
        if self.watched.load(Ordering::Relaxed) != 0 {
            self.wake_watched(key);
        }
    }

    /// [`Wakes::wake`] once some key has an interest: out of line, so that a release with no waiter
    /// anywhere costs one load and no call.
    #[inline(never)]
    fn wake_watched(&self, key: &str) {
        if let Some((watch, _)) = self.lock().get(key) {
            watch.released.notify_waiters();
        }
    }

    /// Wakes every waiter on every key (a subscription was remade: a release may have gone unheard).
    pub(crate) fn wake_all(&self) {
        for (watch, _) in self.lock().values() {
            watch.released.notify_waiters();
        }
        for turn in self.turns().values() {
            turn.notify_one();
        }
    }

    /// (The turns' subscription stays once made: unsubscribing between two waits, and subscribing
    /// again, would leave a moment in which a turn goes unheard, and cost two commands a wait.)
    fn drop_turn(&self, n: u64) {
        self.turns().remove(&n);
    }

    fn drop_interest(&self, key: &Arc<str>) {
        let mut keys = self.lock();
        if let Some((_, count)) = keys.get_mut(key) {
            *count -= 1;
            if *count == 0 {
                keys.remove(key);
                self.watched.fetch_sub(1, Ordering::Relaxed);
                if let Some(hook) = &self.hook {
                    hook(Topic::Key(key), false);
                }
            }
        }
    }
}

/// An interest in one key's releases; dropping it ends the interest.
pub struct Interest {
    wakes: Arc<Wakes>,
    key: Arc<str>,
    watch: Arc<Watch>,
}

impl Interest {
    /// Completes at the next release on the key after it is enabled (`Notified::enable`) or first polled:
    /// enable it before checking for room, and no release in between goes unheard (once
    /// [`Interest::heard`] has completed).
    pub fn notified(&self) -> Notified<'_> {
        self.watch.released.notified()
    }

    /// Completes once releases on the key are heard: at once in memory; on Redis when the key's
    /// subscription is in force (a release announced before then is not heard). Bound it with a
    /// timeout: a subscription that cannot be made never completes it.
    pub async fn heard(&self) {
        loop {
            let subscribed = self.watch.subscribed.notified();
            tokio::pin!(subscribed);
            subscribed.as_mut().enable();
            if self.watch.heard.load(Ordering::Acquire) {
                return;
            }
            subscribed.await;
        }
    }

    /// The key.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        self.wakes.drop_interest(&self.key);
    }
}

impl std::fmt::Debug for Interest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interest").field("key", &self.key).finish()
    }
}

/// One waiter's ticket: its name, and its wake-up when its turn comes; dropping it ends the wake-up (the
/// waiter gives up its place in the store with [`Wakeups::leave`]).
pub struct Turn {
    wakes: Arc<Wakes>,
    n: u64,
    name: String,
    notify: Arc<Notify>,
}

impl Turn {
    /// The ticket's name, unique among the store's waiters.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Completes at the ticket's next turn, or at once if one came since the last (a wake-up is kept).
    pub async fn called(&self) {
        self.notify.notified().await;
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
