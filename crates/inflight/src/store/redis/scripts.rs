//! The Lua scripts, each `common.lua` followed by its own file; run with EVALSHA, reloaded on NOSCRIPT.

use std::sync::LazyLock;

use redis::Script;

macro_rules! script {
    ($file:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!("scripts/common.lua"),
                include_str!($file)
            ))
        })
    };
}

pub(super) static ACQUIRE: LazyLock<Script> = script!("scripts/acquire.lua");
pub(super) static RELEASE: LazyLock<Script> = script!("scripts/release.lua");
pub(super) static RENEW: LazyLock<Script> = script!("scripts/renew.lua");
pub(super) static STATUS: LazyLock<Script> = script!("scripts/status.lua");
