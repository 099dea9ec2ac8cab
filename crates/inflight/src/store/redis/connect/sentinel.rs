//! Sentinel: `redis+sentinel://[user:password@]host:port,host:port/master-name[?db=N]` (`rediss+sentinel`
//! for TLS; `sentinel_username` and `sentinel_password` in the query when the sentinels want their
//! own). The primary is looked up through any sentinel that answers and followed through failovers
//! (which redis-rs's own Sentinel client does not do): a command that fails because the primary went (a
//! lost connection, a refusal, a timeout, READONLY) makes the store ask the sentinels again, and a
//! `+switch-master` subscription and a poll every [`POLL`] catch a failover without an error. When the
//! primary changed, the failed command is sent once more to the new one (every script is idempotent by
//! permit id). While the sentinels still name the lost primary, commands fail at once and the limiter's
//! failure policy decides.

use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncConnectionConfig, Client, RedisError, RedisResult};

use super::cluster::split_nodes;
use super::options::{client, invalid_url, ConnOptions};
use super::version;
use crate::error::StoreError;

/// How often the sentinels are asked which primary they name, besides `+switch-master`.
pub(super) const POLL: Duration = Duration::from_secs(1);
/// The least time between two lookups prompted by errors (many commands fail together).
const LOOKUP_GAP: Duration = Duration::from_millis(50);

/// The primary in use now.
struct Current {
    generation: u64,
    addr: (String, u16),
    manager: ConnectionManager,
    client: Client,
    /// Set once this primary's version passed (`version.rs`), before its first command.
    checked: tokio::sync::OnceCell<()>,
}

impl Current {
    /// Sends (with `send`) to this primary, once its version passed.
    async fn send<T, F>(&self, send: &impl Fn(ConnectionManager) -> F) -> RedisResult<T>
    where
        F: std::future::Future<Output = RedisResult<T>>,
    {
        let check = || version::check_one(self.manager.clone());
        self.checked.get_or_try_init(check).await?;
        send(self.manager.clone()).await
    }
}

/// The primary Sentinel names, followed.
pub(crate) struct Follower {
    master: String,
    sentinels: Vec<Client>,
    /// `redis://` or `rediss://`, credentials with their `@`, and `/db`: a primary's URL around its address.
    scheme: &'static str,
    credentials: String,
    db: i64,
    root_cert: Option<Vec<u8>>,
    config: ConnectionManagerConfig,
    timeouts: AsyncConnectionConfig,
    current: RwLock<Option<Arc<Current>>>,
    /// One lookup at a time, and when the last one was.
    lookup: tokio::sync::Mutex<Option<Instant>>,
}

impl Follower {
    /// Parses the URL and starts following; connects on first use.
    pub(super) fn open(
        options: &ConnOptions,
        rest: &str,
        scheme: &'static str,
    ) -> Result<(Arc<Follower>, String), StoreError> {
        let (credentials, nodes, tail) = split_nodes(rest)?;
        let tail = tail
            .strip_prefix('/')
            .ok_or_else(|| invalid_url("no master name"))?;
        let (master, query) = tail.split_once('?').unwrap_or((tail, ""));
        if master.is_empty() || master.contains('/') {
            return Err(invalid_url("the path must be the master's name"));
        }
        let (mut db, mut sentinel_user, mut sentinel_password) = (0i64, None, None);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("db", n)) => {
                    db = n.parse().map_err(|_| invalid_url("db must be a number"))?
                }
                Some(("sentinel_username", user)) => sentinel_user = Some(user),
                Some(("sentinel_password", password)) => sentinel_password = Some(password),
                _ => {
                    return Err(invalid_url(
                        "unknown option (db, sentinel_username, sentinel_password)",
                    ))
                }
            }
        }
        let sentinel_credentials = match (sentinel_user, sentinel_password) {
            (user, Some(password)) => format!("{}:{password}@", user.unwrap_or("")),
            (Some(user), None) => format!("{user}@"),
            (None, None) => String::new(),
        };
        let root_cert = options.root_cert.clone();
        let sentinels = nodes
            .iter()
            .map(|node| {
                let node = if node.contains(':') {
                    node.to_string()
                } else {
                    format!("{node}:26379")
                };
                client(
                    format!("{scheme}://{sentinel_credentials}{node}").as_str(),
                    root_cert.as_deref(),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let follower = Arc::new(Follower {
            master: master.to_owned(),
            sentinels,
            scheme,
            credentials: credentials.to_owned(),
            db,
            root_cert,
            config: options.manager_config(),
            timeouts: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(options.connection_timeout))
                .set_response_timeout(Some(options.response_timeout)),
            current: RwLock::new(None),
            lookup: tokio::sync::Mutex::new(None),
        });
        tokio::spawn(watch(Arc::downgrade(&follower)));
        let target = format!("sentinel {}/{master}", nodes.join(","));
        Ok((follower, target))
    }

    /// The database of the primary's connection.
    pub(super) fn db(&self) -> i64 {
        self.db
    }

    /// The primary's client (for the subscription of the view of overrides), looked up if need be.
    pub(super) async fn client(&self) -> RedisResult<Client> {
        Ok(self.current().await?.client.clone())
    }

    /// Sends (with `send`: a command or a pipeline) to the primary; once more to a new primary if the
    /// first one turned out gone.
    pub(super) async fn send<T, F>(&self, send: impl Fn(ConnectionManager) -> F) -> RedisResult<T>
    where
        F: std::future::Future<Output = RedisResult<T>>,
    {
        let current = self.current().await?;
        match current.send(&send).await {
            Err(error) if gone(&error) && self.moved_on(current.generation).await => {
                self.current().await?.send(&send).await
            }
            result => result,
        }
    }

    async fn current(&self) -> RedisResult<Arc<Current>> {
        if let Some(current) = self.now() {
            return Ok(current);
        }
        self.moved_on(0).await;
        self.now().ok_or_else(|| {
            RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "no sentinel named a primary",
            ))
        })
    }

    fn now(&self) -> Option<Arc<Current>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn generation(&self) -> u64 {
        self.now().map_or(0, |c| c.generation)
    }

    /// After a failure on the primary of `generation`: asks the sentinels (unless one just did) and
    /// swaps to the primary they name if it is another; true when the primary is now another one.
    async fn moved_on(&self, generation: u64) -> bool {
        let mut last = self.lookup.lock().await;
        if self.generation() != generation {
            return true;
        }
        if last.is_some_and(|at| at.elapsed() < LOOKUP_GAP) {
            return false;
        }
        *last = Some(Instant::now());
        match self.ask().await {
            Some(addr) => self.follow(addr),
            None => false,
        }
    }

    /// The primary the first sentinel that answers names.
    async fn ask(&self) -> Option<(String, u16)> {
        for sentinel in &self.sentinels {
            let asked = async {
                let mut conn = sentinel
                    .get_multiplexed_async_connection_with_config(&self.timeouts)
                    .await?;
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&self.master)
                    .query_async::<Option<(String, u16)>>(&mut conn)
                    .await
            };
            match asked.await {
                Ok(Some(addr)) => return Some(addr),
                Ok(None) => {
                    tracing::warn!(master = %self.master, "a sentinel knows no such master")
                }
                Err(error) => tracing::debug!(%error, "a sentinel did not answer"),
            }
        }
        None
    }

    /// Uses the primary at `addr` from now on, unless it is the one in use; true when it swapped.
    fn follow(&self, addr: (String, u16)) -> bool {
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        if current.as_ref().is_some_and(|c| c.addr == addr) {
            return false;
        }
        let host = if addr.0.contains(':') {
            format!("[{}]", addr.0)
        } else {
            addr.0.clone()
        };
        let url = format!(
            "{}://{}{host}:{}/{}",
            self.scheme, self.credentials, addr.1, self.db
        );
        let made = client(url.as_str(), self.root_cert.as_deref()).and_then(|client| {
            let manager =
                ConnectionManager::new_lazy_with_config(client.clone(), self.config.clone())
                    .map_err(StoreError::from)?;
            Ok((client, manager))
        });
        let (client, manager) = match made {
            Ok(made) => made,
            Err(error) => {
                tracing::warn!(%error, "the primary the sentinels name cannot be used");
                return false;
            }
        };
        let generation = current.as_ref().map_or(0, |c| c.generation) + 1;
        if generation > 1 {
            tracing::warn!(host = %addr.0, port = addr.1, "following the new primary Sentinel names");
        }
        *current = Some(Arc::new(Current {
            generation,
            addr,
            manager,
            client,
            checked: tokio::sync::OnceCell::new(),
        }));
        true
    }
}

/// Errors after which the primary may be another one.
fn gone(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || error.code() == Some("READONLY")
}

/// Follows `+switch-master` on one sentinel after another, and asks every [`POLL`], until the store goes.
async fn watch(follower: Weak<Follower>) {
    let mut attempt = 0usize;
    loop {
        let Some(strong) = follower.upgrade() else {
            return;
        };
        let sentinel = strong.sentinels[attempt % strong.sentinels.len()].clone();
        drop(strong);
        attempt += 1;
        if let Err(error) = listen(&sentinel, &follower).await {
            tracing::debug!(%error, "the subscription to a sentinel ended; trying the next");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

async fn listen(sentinel: &Client, follower: &Weak<Follower>) -> RedisResult<()> {
    let within = Duration::from_secs(1);
    let subscribed = tokio::time::timeout(within, async {
        let mut pubsub = sentinel.get_async_pubsub().await?;
        pubsub.subscribe("+switch-master").await?;
        Ok::<_, RedisError>(pubsub)
    });
    let pubsub = match subscribed.await {
        Ok(pubsub) => pubsub?,
        Err(_) => return Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into()),
    };
    let mut messages = pubsub.into_on_message();
    let mut poll = tokio::time::interval(POLL);
    loop {
        tokio::select! {
            message = messages.next() => {
                let Some(message) = message else {
                    return Err(std::io::Error::from(std::io::ErrorKind::ConnectionAborted).into());
                };
                let Some(follower) = follower.upgrade() else { return Ok(()) };
                // "<master name> <old ip> <old port> <new ip> <new port>"
                let payload: String = message.get_payload()?;
                let parts: Vec<&str> = payload.split(' ').collect();
                if let [name, _, _, ip, port] = parts[..] {
                    if name == follower.master {
                        if let Ok(port) = port.parse() {
                            follower.follow((ip.to_owned(), port));
                        }
                    }
                }
            }
            _ = poll.tick() => {
                let Some(follower) = follower.upgrade() else { return Ok(()) };
                if follower.now().is_some() {
                    let generation = follower.generation();
                    follower.moved_on(generation).await;
                }
            }
        }
    }
}
