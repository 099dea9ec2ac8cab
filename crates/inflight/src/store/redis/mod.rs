//! The Redis stores: leases and overrides shared by every process that uses the same Redis.
//!
//! Every operation is one Lua script (`scripts/*.lua`, each with a header naming its KEYS and ARGV and
//! saying why it must be atomic; `scripts.rs` loads them), run with EVALSHA over a multiplexed
//! connection that reconnects by itself. Deadlines come from Redis `TIME`, one clock for every worker.
//!
//! - `connect/`: the way to Redis (one server, a Redis Cluster, or the primary Sentinel names) and its
//!   options, which each store's builder fills in.
//! - [`RedisStore`] (`store.rs`, opened by `builder.rs`) in inflight's own keys (`naming.rs`), and its
//!   operations: admissions and releases in batches (`batch.rs`; on a cluster, keys of several slots:
//!   `across.rs`), a key's status (`status.rs`), the index of remote permits (`index.rs`), busy keys
//!   (`listing.rs`), quotas (`quota.rs`), the views of overrides and balances (`overrides.rs`), wake-ups
//!   (`wakeups.rs`).
//! - [`DifyStore`] (`dify/`): Dify's own keys, shared with its workers during a migration.

mod across;
mod batch;
mod builder;
mod connect;
mod dify;
mod error;
mod index;
mod listing;
mod naming;
mod overrides;
mod quota;
mod scripts;
mod status;
mod store;
mod wakeups;

pub use self::builder::{RedisStoreBuilder, DEFAULT_PREFIX};
pub use self::dify::{DifyStore, DifyStoreBuilder};
pub use self::store::RedisStore;
