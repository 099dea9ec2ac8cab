//! Helpers of the inflight tests.
#![allow(dead_code, unreachable_pub, unused_imports)]

pub mod child;
pub mod failover;
pub mod gate;
pub mod ops;

pub use test_support::{unique_prefix, TestCluster, TestRedis, TestSentinel};
