//! [`BusyKeys`] on Redis: `SCAN` over the lease sets under the prefix (`MATCH`, `COUNT` per call), each
//! page's counts read by `busy.lua`, capped at [`MAX_EXAMINED`] names and [`BUSY_TIME_BUDGET`] in all.
//! On a cluster, one scan per primary (found with `CLUSTER SLOTS`, each reached through a slot it
//! serves), and each page's counts read slot by slot. Pages are small and go one at a time in a
//! [`ListingLane`](super::ListingLane), paced, however many listings are in progress: Redis runs one
//! command at a time, and an admission behind a listing's page waits for it.

use std::sync::Arc;
use std::time::Instant;

use super::across;
use super::error::{invoke, retried};
use super::naming::KeyNames;
use super::scripts;
use super::store::{number, RedisStore};
use crate::error::StoreError;
use crate::store::busy::{busiest, BusyKey, BusyKeys, BusyList, BUSY_TIME_BUDGET, MAX_EXAMINED};

/// The `COUNT` of each `SCAN` call: names examined per round trip. Small, so that neither the `SCAN` nor
/// the `busy.lua` call on its page (a few microseconds a key) keeps Redis from admissions for long.
const SCAN_COUNT: usize = 100;

impl BusyKeys for RedisStore {
    /// `SCAN`s the lease sets of the keys under `prefix` (on a cluster, of every primary).
    async fn busy(&self, prefix: &str, limit: usize) -> Result<BusyList, StoreError> {
        // On a cluster a key with a hash tag of its own is named `{tag}<escaped key>`: the prefix is
        // then matched after the names are read.
        let (pattern, nodes) = if self.conn.is_cluster() {
            let pattern = format!("{}{{*:leases", glob_escape(&self.prefix));
            (pattern, self.primaries().await?)
        } else {
            (scan_pattern(&self.prefix, prefix), vec![0])
        };
        let started = Instant::now();
        let (mut examined, mut found) = (0usize, Vec::new());
        for node in nodes {
            let mut cursor = 0u64;
            loop {
                let turn = self.listing_lane.take_turn().await;
                let (next, names) = self.scan_page(node, cursor, &pattern).await?;
                // What Redis looked at: about COUNT names a call, whether they matched or not.
                examined += SCAN_COUNT;
                let keys: Vec<String> = names
                    .iter()
                    .filter_map(|name| user_key(&self.prefix, name))
                    .filter(|key| key.starts_with(prefix))
                    .collect();
                found.extend(self.counts(keys).await?);
                drop(turn);
                cursor = next;
                if cursor == 0 {
                    break;
                }
                if examined >= MAX_EXAMINED || started.elapsed() >= BUSY_TIME_BUDGET {
                    return Ok(busiest(found, limit, true));
                }
            }
        }
        Ok(busiest(found, limit, false))
    }
}

impl RedisStore {
    /// A slot of each primary of the cluster, from `CLUSTER SLOTS`.
    async fn primaries(&self) -> Result<Vec<u16>, StoreError> {
        let answer: redis::Value = retried(|| {
            let mut conn = self.conn.clone();
            async move {
                redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async(&mut conn)
                    .await
            }
        })
        .await?;
        let unexpected = || StoreError::Protocol("unexpected answer to CLUSTER SLOTS".into());
        let ranges: Vec<Vec<redis::Value>> =
            redis::from_redis_value(answer).map_err(|_| unexpected())?;
        let mut primaries: Vec<(redis::Value, u16)> = Vec::new();
        for range in ranges {
            let (Some(redis::Value::Int(start)), Some(redis::Value::Array(node))) =
                (range.first(), range.get(2))
            else {
                return Err(unexpected());
            };
            // The node by its address (its first two fields).
            let address = redis::Value::Array(node.iter().take(2).cloned().collect());
            if !primaries.iter().any(|(known, _)| *known == address) {
                let start = u16::try_from(*start).map_err(|_| unexpected())?;
                primaries.push((address, start));
            }
        }
        Ok(primaries.into_iter().map(|(_, slot)| slot).collect())
    }

    /// One page of the scan of the primary that serves `slot` (on one server: the server).
    async fn scan_page(
        &self,
        slot: u16,
        cursor: u64,
        pattern: &str,
    ) -> Result<(u64, Vec<String>), StoreError> {
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT);
        let page = retried(|| self.conn.on_primary_of(slot, &scan)).await?;
        redis::from_redis_value(page)
            .map_err(|e| StoreError::Protocol(format!("unexpected answer to SCAN: {e}")))
    }

    /// The busy ones of `keys`, with their counts: one `busy.lua` call per slot, all at once.
    async fn counts(&self, keys: Vec<String>) -> Result<Vec<BusyKey>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let names = self.names(&keys);
        let groups = match self.conn.is_cluster() {
            true => across::groups(&names),
            false => vec![(0..keys.len()).collect()],
        };
        let calls = groups.iter().map(|group| self.count_group(&names, group));
        let answers = futures_util::future::try_join_all(calls).await?;
        let mut busy = Vec::new();
        for (group, out) in groups.iter().zip(answers) {
            for (&i, pair) in group.iter().zip(out.chunks_exact(2)) {
                let (in_flight, override_limit): (u32, u32) = (number(pair[0])?, number(pair[1])?);
                if in_flight > 0 {
                    busy.push(BusyKey {
                        key: Arc::from(keys[i].as_str()),
                        in_flight,
                        override_limit: (override_limit > 0).then_some(override_limit),
                    });
                }
            }
        }
        Ok(busy)
    }

    /// `busy.lua` on the keys `group` of `names` (all in one slot): two numbers a key.
    async fn count_group(
        &self,
        names: &[KeyNames],
        group: &[usize],
    ) -> Result<Vec<i64>, StoreError> {
        let mut invocation = scripts::BUSY.prepare_invoke();
        for &i in group {
            names[i].declare(&mut invocation);
        }
        invocation.arg(self.offset());
        let out: Vec<i64> = invoke(&self.conn, &invocation).await?;
        if out.len() != group.len() * 2 {
            return Err(StoreError::Protocol(format!(
                "busy answered {} numbers for {} keys",
                out.len(),
                group.len()
            )));
        }
        Ok(out)
    }
}

/// The `MATCH` pattern of the lease sets of the user keys starting with `key_prefix`:
/// `<prefix>{<escaped key prefix>*}:leases`, with the glob's own characters escaped.
fn scan_pattern(prefix: &str, key_prefix: &str) -> String {
    // The escaped name of the prefix, less what closes the tag: escaping is per character, so every
    // longer key's escaped name starts with it.
    let names = KeyNames::new("", key_prefix, false);
    let tag = names.tag();
    let escaped = if key_prefix.is_empty() {
        ""
    } else {
        &tag[1..tag.len() - 1]
    };
    let (prefix, escaped) = (glob_escape(prefix), glob_escape(escaped));
    format!("{prefix}{{{escaped}*}}:leases")
}

fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The user key of a lease set's name `<prefix>{<escaped key>}:leases` (on a cluster, for a key with a
/// hash tag of its own, `<prefix>{<tag>}<escaped key>:leases`), if it is one.
fn user_key(prefix: &str, name: &str) -> Option<String> {
    let (tag, after) = name
        .strip_prefix(prefix)?
        .strip_prefix('{')?
        .strip_suffix(":leases")?
        .split_once('}')?;
    // An escaped key holds no brace: the tag is the key, or the key follows it.
    let escaped = if after.is_empty() { tag } else { after };
    if escaped == "%" {
        return Some(String::new());
    }
    // Each `%` starts two hex digits.
    let mut parts = escaped.split('%');
    let mut out = parts.next()?.as_bytes().to_vec();
    for part in parts {
        out.push(u8::from_str_radix(part.get(..2)?, 16).ok()?);
        out.extend_from_slice(&part.as_bytes()[2..]);
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_sets_name_gives_back_its_user_key() {
        for key in ["app-1", "a}b{c", "%", "x}:leases", "ünï:*?[]\\", "a\nb", ""] {
            let name = KeyNames::new("inflight:", key, false).leases().to_string();
            assert_eq!(user_key("inflight:", &name).as_deref(), Some(key), "{name}");
        }
        for key in ["{t1}:app:a1", "{t1}", "{}x", "a{b}c"] {
            let name = KeyNames::new("inflight:", key, true).leases().to_string();
            assert_eq!(user_key("inflight:", &name).as_deref(), Some(key), "{name}");
        }
        assert_eq!(user_key("inflight:", "inflight:{a}:permits"), None);
        assert_eq!(user_key("inflight:", "other:{a}:leases"), None);
    }

    #[test]
    fn the_pattern_escapes_glob_characters_and_the_keys_own_escapes() {
        assert_eq!(scan_pattern("inflight:", ""), "inflight:{*}:leases");
        assert_eq!(scan_pattern("inflight:", "app:"), "inflight:{app:*}:leases");
        assert_eq!(scan_pattern("p*[", "a*?{"), "p\\*\\[{a\\*\\?%7B*}:leases");
        assert_eq!(scan_pattern("p:", "x\\]"), "p:{x\\\\\\]*}:leases");
    }
}
