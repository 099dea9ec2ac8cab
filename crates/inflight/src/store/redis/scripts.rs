//! The Lua scripts: `common.lua` followed by the script's own files; run with EVALSHA, reloaded on
//! NOSCRIPT.

use std::sync::LazyLock;

use redis::Script;

macro_rules! script {
    ($($file:literal),+) => {
        LazyLock::new(|| Script::new(concat!(include_str!("scripts/common.lua"), $(include_str!($file)),+)))
    };
}

pub(super) static BATCH: LazyLock<Script> = script!("scripts/queue.lua", "scripts/batch.lua");
pub(super) static RENEW: LazyLock<Script> = script!("scripts/renew.lua");
pub(super) static STATUS: LazyLock<Script> = script!("scripts/queue.lua", "scripts/status.lua");
pub(super) static DIFY: LazyLock<Script> = script!("scripts/queue.lua", "scripts/dify.lua");
/// Alone (it reads no user key): the index of overrides on Redis Cluster.
pub(super) static INDEX: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/index.lua")));
/// Balances and reservations (`quota.rs`).
pub(super) static QUOTA: LazyLock<Script> = script!("scripts/quota.lua");
/// The busy keys' counts, read only (`listing.rs`).
pub(super) static BUSY: LazyLock<Script> = script!("scripts/busy.lua");
