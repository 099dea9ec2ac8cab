//! The memory store's hasher.

/// A fast hasher seeded per process, so that chosen keys or ids cannot flood one bucket.
pub(super) type Hasher = foldhash::fast::RandomState;
