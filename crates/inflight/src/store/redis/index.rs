//! The index of permits handed to remote callers: `<prefix>permit:<id>` holds a permit's keys, with an
//! expiry, so that a caller that knows only the id can renew or release it from any process.

use std::sync::Arc;

use super::error::retried;
use super::naming::Member;
use super::store::RedisStore;
use crate::error::StoreError;
use crate::id::PermitId;
use crate::store::{IndexOp, Recorded};

/// Writes an index entry (KEYS[1]; ARGV: the entry, its keys' part, ttl ms) unless the entry there
/// records other keys (its keys' part, after the lease length and `;`, differs): 1 written, 0 not.
static PUT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        "local old = redis.call('GET', KEYS[1])
        if old then
          local start = (string.find(old, ';', 1, true) or #old) + 1
          local i = start
          while i <= #old and string.sub(old, i, i) ~= 'q' do
            local colon = string.find(old, ':', i, true)
            if not colon then break end
            i = colon + 1 + (tonumber(string.sub(old, i, colon - 1)) or 0)
          end
          if string.sub(old, start, i - 1) ~= ARGV[2] then return 0 end
        end
        redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
        return 1",
    )
});

impl RedisStore {
    pub(super) async fn index_op(
        &self,
        id: &PermitId,
        op: IndexOp<'_>,
    ) -> Result<Option<Recorded>, StoreError> {
        let mut name = format!("{}permit:", self.prefix).into_bytes();
        name.extend_from_slice(&Member(id).bytes());
        let mut pipe = redis::pipe();
        match op {
            IndexOp::Put {
                keys,
                lease_ms,
                ttl_ms,
                quota,
            } => {
                let keys_part = encode(keys, 0, None).split_off(2); // without "0;"
                let mut put = PUT.prepare_invoke();
                put.key(&name)
                    .arg(encode(keys, lease_ms, quota))
                    .arg(keys_part)
                    .arg(ttl_ms.max(1));
                let put = &put;
                let kept: i64 = retried(|| {
                    let mut conn = self.conn.clone();
                    async move { put.invoke_async(&mut conn).await }
                })
                .await?;
                return match kept {
                    1 => Ok(None),
                    _ => Err(StoreError::IdInUse),
                };
            }
            IndexOp::Get => {
                pipe.cmd("GET").arg(&name);
            }
            IndexOp::Remove => {
                pipe.cmd("DEL").arg(&name).ignore();
            }
        }
        let pipe = &pipe;
        let found: Vec<redis::Value> = retried(|| {
            let mut conn = self.conn.clone();
            async move { pipe.query_async(&mut conn).await }
        })
        .await?;
        match (op, found.into_iter().next()) {
            (IndexOp::Put { .. } | IndexOp::Remove, _) | (_, None | Some(redis::Value::Nil)) => {
                Ok(None)
            }
            (_, Some(redis::Value::BulkString(bytes))) => decode(&bytes).map(Some),
            (_, Some(other)) => Err(StoreError::Protocol(format!(
                "an index entry read as {other:?}"
            ))),
        }
    }
}

/// The lease length and `;`, then each key as its length in bytes, `:`, and the key; then, for a permit
/// with a reservation to settle, `q` and its quota key the same way (an entry without one reads as
/// before quotas were recorded).
fn encode(keys: &[Arc<str>], lease_ms: u64, quota: Option<&str>) -> Vec<u8> {
    let mut out = format!("{lease_ms};").into_bytes();
    let quota = quota.map(|quota| ("q", quota));
    for (mark, key) in keys.iter().map(|key| ("", &**key)).chain(quota) {
        out.extend_from_slice(format!("{mark}{}:", key.len()).as_bytes());
        out.extend_from_slice(key.as_bytes());
    }
    out
}

fn decode(bytes: &[u8]) -> Result<Recorded, StoreError> {
    let bad = || StoreError::Protocol("a malformed index entry".into());
    let semicolon = bytes.iter().position(|b| *b == b';').ok_or_else(bad)?;
    let lease_ms: u64 = number(&bytes[..semicolon]).ok_or_else(bad)?;
    let mut bytes = &bytes[semicolon + 1..];
    let (mut keys, mut quota) = (Vec::new(), None);
    while !bytes.is_empty() {
        let is_quota = bytes[0] == b'q';
        if is_quota {
            bytes = &bytes[1..];
        }
        let colon = bytes.iter().position(|b| *b == b':').ok_or_else(bad)?;
        let len: usize = number(&bytes[..colon]).ok_or_else(bad)?;
        let rest = &bytes[colon + 1..];
        let key = rest.get(..len).ok_or_else(bad)?;
        let key: Arc<str> = Arc::from(std::str::from_utf8(key).map_err(|_| bad())?);
        match is_quota {
            true => quota = Some(key),
            false if quota.is_none() => keys.push(key),
            false => return Err(bad()),
        }
        bytes = &rest[len..];
    }
    if keys.is_empty() {
        return Err(bad());
    }
    Ok(Recorded {
        keys: keys.into(),
        lease_ms,
        quota,
    })
}

/// A number written out in decimal.
fn number<T: std::str::FromStr>(digits: &[u8]) -> Option<T> {
    std::str::from_utf8(digits).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_survive_the_round_trip_whatever_they_hold() {
        let keys: Vec<Arc<str>> = ["tenant:t1", "a:b:9", "", "12:x", "clé"]
            .into_iter()
            .map(Arc::from)
            .collect();
        let recorded = decode(&encode(&keys, 600_000, None)).unwrap();
        assert_eq!(
            (&*recorded.keys, recorded.lease_ms, recorded.quota),
            (keys.as_slice(), 600_000, None)
        );
        for quota in ["tenant:t1", "", "q1:x;", "clé"] {
            let recorded = decode(&encode(&keys, 5, Some(quota))).unwrap();
            assert_eq!(&*recorded.keys, keys.as_slice());
            assert_eq!(recorded.quota.as_deref(), Some(quota));
        }
        // Written before quotas were recorded: read the same.
        assert_eq!(&*decode(b"7;3:a:b").unwrap().keys, [Arc::from("a:b")]);
        assert!(decode(b"7;q1:a").is_err(), "a quota but no keys");
        assert!(decode(b"7;q1:a1:b").is_err(), "keys after the quota");
        assert!(decode(b"1;5:abc").is_err());
        assert!(decode(b"5:abc").is_err());
        assert!(decode(b"").is_err());
    }
}
