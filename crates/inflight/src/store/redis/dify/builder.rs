//! [`DifyStoreBuilder`]: a [`RedisStoreBuilder`]'s settings and the age of Dify's stale entries.

use std::sync::Arc;
use std::time::Duration;

use super::store::DifyStore;
use crate::clock::millis;
use crate::error::StoreError;
use crate::store::redis::builder::RedisStoreBuilder;
use crate::store::redis::connect::Conn;
use crate::store::redis::wakeups;

/// Builds a [`DifyStore`]: made by [`RedisStoreBuilder::dify`] or [`DifyStore::builder`].
#[derive(Debug)]
#[must_use]
pub struct DifyStoreBuilder {
    plain: RedisStoreBuilder,
    stale_after: Duration,
    key_prefix: String,
}

impl RedisStoreBuilder {
    /// A [`DifyStore`] with these settings instead: Dify's own keys, shared with its workers during a
    /// migration. Each admission and release goes alone: the pipeline and replicas to wait for do not apply.
    pub fn dify(self) -> DifyStoreBuilder {
        DifyStoreBuilder {
            plain: self,
            stale_after: Duration::from_secs(600),
            key_prefix: String::new(),
        }
    }
}

impl DifyStore {
    /// Starts building a store for `url` (see [`RedisStoreBuilder::open`] for the URLs, but a cluster's).
    pub fn builder(url: impl Into<String>) -> DifyStoreBuilder {
        crate::RedisStore::builder(url).dify()
    }
}

impl DifyStoreBuilder {
    /// How old a Dify worker's entry must be before an admission that needs its slot evicts it (600 s).
    pub fn stale_after(mut self, age: Duration) -> Self {
        self.stale_after = age;
        self
    }

    /// Dify's `REDIS_KEY_PREFIX` (none by default), applied as Dify's `redis_client` (Dify 1.14 and
    /// later) applies it to the names its methods take (`hlen`, `hset`, `hdel`, `setex`, `get`, ...):
    /// `<prefix>:<name>`, so an app's hash is `<prefix>:dify:rate_limit:K:active_requests` and its limit
    /// `<prefix>:dify:rate_limit:K:max_active_requests`. inflight's side keys follow the hash's name.
    /// Surrounding whitespace is dropped; empty: none.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        // As Python's str.strip(), which Dify uses: Unicode whitespace and the ASCII separators 0x1c-0x1f.
        let space = |c: char| c.is_whitespace() || ('\x1c'..='\x1f').contains(&c);
        self.key_prefix = prefix.into().trim_matches(space).to_owned();
        self
    }

    /// Checks the URL and prepares the connection, as [`RedisStoreBuilder::open`] does; a Redis Cluster
    /// is refused (`store.rs` says why).
    pub fn open(self) -> Result<DifyStore, StoreError> {
        let (conn, target) = Conn::open(&self.plain.conn)?;
        if conn.is_cluster() {
            return Err(StoreError::Rejected(
                "the Dify layout is not supported on Redis Cluster: an app's two Dify keys hash to \
                 different slots, so no script can count and admit against both (docs/dify.md)"
                    .into(),
            ));
        }
        let key_prefix: Arc<str> = match self.key_prefix.as_str() {
            "" => "".into(),
            prefix => format!("{prefix}:").into(),
        };
        let wakes = wakeups::start(conn.clone(), self.plain.turns_channel());
        Ok(DifyStore {
            plain: self.plain.assemble(conn, target, wakes),
            stale_ms: millis(self.stale_after),
            key_prefix,
        })
    }
}
