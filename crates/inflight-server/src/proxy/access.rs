//! What the proxy says about each request it answers: one count in `inflight_proxy_requests_total` when
//! its status is known, and one access line (target `inflight::access`, level info) when its response has
//! ended, unless `--access-log false`: method, path without its query (which may carry secrets), status,
//! result, class, the key's hash (its raw value only with `--metrics-per-key`), duration and, for the
//! proxy's own answers, the error code. Headers are never logged.

use std::sync::Arc;
use std::time::Instant;

use http::{Method, Request, StatusCode};

use crate::metrics::{Metrics, ProxiedClass, ProxyResult};

/// The longest path an access line shows, in bytes.
const MAX_PATH: usize = 512;

/// A request being answered: what its access line and its count need.
pub(super) struct Access {
    method: Method,
    path: String,
    started: Instant,
    /// The class of its (first) key, with its counters; `none` until keys are formed.
    class: Arc<ProxiedClass>,
    /// Its first key, for per-key metrics only.
    first_key: Option<String>,
    /// Its keys as logged: hashes, or the keys themselves with per-key metrics.
    keys: Option<String>,
    /// Whether metrics (and so the line) may name keys.
    per_key: bool,
    log: bool,
}

impl Access {
    /// The record of `request`, arrived now.
    pub(super) fn new<B>(request: &Request<B>, metrics: &Metrics, log: bool) -> Self {
        // No line either when the log's level leaves access lines out.
        let log = log && tracing::enabled!(target: "inflight::access", tracing::Level::INFO);
        // What only the line shows is kept only when there is a line.
        let mut path = match log {
            true => request.uri().path().to_owned(),
            false => String::new(),
        };
        if path.len() > MAX_PATH {
            let mut end = MAX_PATH;
            while !path.is_char_boundary(end) {
                end -= 1;
            }
            path.truncate(end);
        }
        Self {
            method: request.method().clone(),
            path,
            started: Instant::now(),
            class: metrics.no_class(),
            first_key: None,
            keys: None,
            per_key: metrics.per_key(),
            log,
        }
    }

    /// The keys the request is admitted under.
    pub(super) fn keys(&mut self, keys: &[String], policy: &inflight::Policy, metrics: &Metrics) {
        let Some(first) = keys.first() else {
            return;
        };
        self.class = metrics.proxied_class(policy.class_of(first));
        let per_key = self.per_key;
        self.first_key = per_key.then(|| first.clone());
        if !self.log {
            return;
        }
        // One string, each key (or its hash) written into it once.
        let mut shown = String::with_capacity(keys.len() * 17);
        for key in keys {
            if !shown.is_empty() {
                shown.push(',');
            }
            match per_key {
                true => shown.push_str(key),
                false => push_hash(&mut shown, key),
            }
        }
        self.keys = Some(shown);
    }

    /// The class of its (first) key, with its counters.
    pub(super) fn class(&self) -> Arc<ProxiedClass> {
        self.class.clone()
    }

    /// Counts the request, answered `status` with `result`; its access line is written when the
    /// returned [`Line`] is dropped (when the response has ended).
    pub(super) fn answered(
        self,
        metrics: &Metrics,
        status: StatusCode,
        result: ProxyResult,
        code: Option<&'static str>,
    ) -> Option<Line> {
        metrics.proxied(status, &self.class, self.first_key.as_deref(), result);
        // Made only when logged: a line logs when dropped.
        self.log.then(|| Line {
            access: self,
            status,
            result,
            code,
        })
    }
}

/// An access line, written when dropped.
pub(super) struct Line {
    access: Access,
    status: StatusCode,
    result: ProxyResult,
    code: Option<&'static str>,
}

impl Drop for Line {
    fn drop(&mut self) {
        let access = &self.access;
        let duration_ms = u64::try_from(access.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let (key, key_hash) = match &access.keys {
            Some(keys) if access.per_key => (Some(keys.as_str()), None),
            Some(keys) => (None, Some(keys.as_str())),
            None => (None, None),
        };
        tracing::info!(
            target: "inflight::access",
            method = %access.method,
            path = %access.path,
            status = self.status.as_u16(),
            result = self.result.as_str(),
            class = %access.class.name(),
            key,
            key_hash,
            code = self.code,
            duration_ms,
            "access"
        );
    }
}

/// How many keys' hashes each worker thread keeps.
const HASHES_KEPT: usize = 256;

/// The key as `{bearer_hash}` would hash it, so that lines can be followed by key without showing it.
/// A tenant's requests repeat its key, and SHA-256 is most of what an access line costs, so each
/// worker thread keeps the hashes it made last, one per place of a small table (a key's place is its
/// std hash's; a key met there again is not hashed again).
fn push_hash(shown: &mut String, key: &str) {
    type Kept = Vec<Option<(Box<str>, [u8; 16])>>;
    thread_local! {
        static KEPT: std::cell::RefCell<Kept> = std::cell::RefCell::new(vec![None; HASHES_KEPT]);
    }
    KEPT.with_borrow_mut(|kept| {
        let place = &mut kept[slot_of(key)];
        let hex = match place {
            Some((kept_key, hex)) if **kept_key == *key => *hex,
            _ => {
                let hex = super::sources::short_hash(key);
                *place = Some((key.into(), hex));
                hex
            }
        };
        shown.extend(hex.iter().map(|&digit| char::from(digit)));
    })
}

#[cfg(test)]
fn hash(key: &str) -> String {
    let mut shown = String::new();
    push_hash(&mut shown, key);
    shown
}

/// The place of `key` in a thread's table of hashes.
fn slot_of(key: &str) -> usize {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    let hashed = BuildHasherDefault::<DefaultHasher>::default().hash_one(key);
    (hashed % HASHES_KEPT as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::hash;

    #[test]
    fn a_key_is_logged_as_16_hex_digits_of_its_sha256() {
        // printf 'app:1' | sha256sum
        assert_eq!(hash("app:1"), "d2bb92ca7c6d792d");
        assert_ne!(hash("app:1"), hash("app:2"));
        assert!(hash("app:1").bytes().all(|b| b.is_ascii_hexdigit()));
    }

    #[test]
    fn a_kept_hash_is_the_keys_own_whatever_shares_its_place() {
        let keys: Vec<String> = (0..2 * super::HASHES_KEPT)
            .map(|n| format!("app:{n}"))
            .collect();
        for _ in 0..2 {
            for key in &keys {
                let made =
                    String::from_utf8_lossy(&crate::proxy::sources::short_hash(key)).into_owned();
                assert_eq!(hash(key), made, "{key}");
            }
        }
        assert_eq!(hash("app:1"), "d2bb92ca7c6d792d");
    }
}
