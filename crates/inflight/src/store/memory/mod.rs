//! The in-memory store, [`MemoryStore`], and its decisions on cells of keys.

mod account;
mod cell;
mod decide;
mod funded;
mod hash;
mod holders;
mod index;
mod key;
mod listing;
mod queue;
mod quota;
mod store;

pub use self::store::MemoryStore;
