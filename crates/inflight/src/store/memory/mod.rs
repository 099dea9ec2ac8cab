//! The in-memory store: [`MemoryStore`] (`store.rs`), its decisions (`decide.rs`) on cells of keys
//! (`cell.rs`, `key.rs`), the index of remote permits (`index.rs`), balances (`quota.rs`, `account.rs`)
//! and busy keys (`listing.rs`).

mod account;
mod cell;
mod decide;
mod index;
mod key;
mod listing;
mod quota;
mod store;

pub use self::store::MemoryStore;
