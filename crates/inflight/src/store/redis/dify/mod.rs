//! [`DifyStore`]: Dify's own keys, so that inflight and unmodified Dify workers enforce one cap while a
//! deployment moves over (`store.rs` states what that costs; `scripts/dify.lua` describes the keys).

mod builder;
mod store;

pub use self::builder::DifyStoreBuilder;
pub use self::store::DifyStore;
