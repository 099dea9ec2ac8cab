//! The Redis stores: leases and overrides shared by every process that uses the same Redis.
//!
//! Every operation is one Lua script (`scripts/*.lua`, each with a header naming its KEYS and ARGV and
//! saying why it must be atomic; `scripts.rs` loads them), run with EVALSHA over a multiplexed
//! connection that reconnects by itself. Deadlines come from Redis `TIME`, one clock for every worker.
//! [`RedisStore`] uses inflight's own keys; [`DifyStore`], Dify's, shared with its workers during a migration.

mod across;
mod answer;
mod batch;
mod builder;
mod connect;
mod cpu;
mod dify;
mod error;
mod holders;
mod index;
mod keeper;
mod lane;
mod listing;
mod naming;
mod overrides;
mod quota;
mod records;
mod scripts;
mod status;
mod store;
mod wakeups;

pub use self::builder::{RedisStoreBuilder, DEFAULT_PREFIX};
pub use self::dify::{DifyStore, DifyStoreBuilder};
pub use self::lane::ListingLane;
pub use self::store::RedisStore;
