//! The Lua scripts' entry points, each made of the files `scripts/manifest` names; run with EVALSHA,
//! reloaded on NOSCRIPT.

use std::sync::LazyLock;

use redis::Script;

/// Every script file, by name.
const FILES: [(&str, &str); 13] = [
    ("base.lua", include_str!("scripts/base.lua")),
    ("common.lua", include_str!("scripts/common.lua")),
    ("queue.lua", include_str!("scripts/queue.lua")),
    ("batch.lua", include_str!("scripts/batch.lua")),
    ("lone.lua", include_str!("scripts/lone.lua")),
    ("renew.lua", include_str!("scripts/renew.lua")),
    ("status.lua", include_str!("scripts/status.lua")),
    ("dify.lua", include_str!("scripts/dify.lua")),
    ("index.lua", include_str!("scripts/index.lua")),
    ("quota.lua", include_str!("scripts/quota.lua")),
    ("busy.lua", include_str!("scripts/busy.lua")),
    ("holders.lua", include_str!("scripts/holders.lua")),
    ("manifest", include_str!("scripts/manifest")),
];

/// The script file `name`.
fn file(name: &str) -> Option<&'static str> {
    FILES.iter().find(|file| file.0 == name).map(|file| file.1)
}

/// The text of the entry point `name`: its files (`scripts/manifest`) in order.
fn text(name: &str) -> String {
    let manifest = file("manifest").unwrap_or_default();
    let entry = manifest
        .lines()
        .filter_map(|line| line.split_once(" = "))
        .find(|(entry, _)| *entry == name);
    let Some((_, files)) = entry else {
        panic!("scripts/manifest names no entry point {name}");
    };
    let text = files.split(' ').map(|part| {
        file(part).unwrap_or_else(|| panic!("scripts/manifest names a file unknown here: {part}"))
    });
    text.collect()
}

macro_rules! entry {
    ($name:literal) => {
        LazyLock::new(|| Script::new(&text($name)))
    };
}

pub(super) static BATCH: LazyLock<Script> = entry!("batch");
/// One admission or release on one key, where that is simple (`lone.lua`); else answers nothing.
pub(super) static LONE: LazyLock<Script> = entry!("lone");
pub(super) static RENEW: LazyLock<Script> = entry!("renew");
pub(super) static STATUS: LazyLock<Script> = entry!("status");
pub(super) static DIFY: LazyLock<Script> = entry!("dify");
/// Alone (it reads no user key): the index of overrides on Redis Cluster.
pub(super) static INDEX: LazyLock<Script> = entry!("index");
/// Balances and reservations (`quota.rs`).
pub(super) static QUOTA: LazyLock<Script> = entry!("quota");
/// The busy keys' counts, read only (`listing.rs`).
pub(super) static BUSY: LazyLock<Script> = entry!("busy");
/// A key's holders and waiters listed, or one revoked (`holders.rs`).
pub(super) static HOLDERS: LazyLock<Script> = entry!("holders");

#[cfg(test)]
mod tests {
    #[test]
    fn every_entry_of_the_manifest_is_made_of_known_files() {
        let manifest = super::file("manifest").unwrap();
        for line in manifest.lines().filter(|line| line.contains(" = ")) {
            let (name, _) = line.split_once(" = ").unwrap();
            assert!(!super::text(name).is_empty(), "{name}");
        }
    }
}
