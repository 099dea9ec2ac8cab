//! The oldest Redis inflight supports, [`OLDEST`]: checked from `INFO server`'s `redis_version` before a
//! store's connection sends its first command (one server; on a cluster, every primary's; through
//! Sentinel, each primary it names, when it is first followed), once: not per command, and not again when
//! the connection to the same server is remade. Below it, every command fails with a
//! [`StoreError::Rejected`] that says so (`store rejected the request: unsupported Redis -
//! InvalidClientConfig: Redis 6.0.9 is older than 6.2, the oldest inflight supports`).
//!
//! [`StoreError::Rejected`]: crate::error::StoreError::Rejected

use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisError, RedisResult, Value};

/// The oldest Redis inflight supports: 6.2, the Redis of Dify's compose (`redis:6-alpine`), and the oldest
/// the Redis tests run on (`scripts/test.sh` runs them on a 6.2 server as well as on Debian's); an older
/// one is untested, so refused.
pub(crate) const OLDEST: (u32, u32, u32) = (6, 2, 0);

/// `X.Y[.Z]` as numbers; a part's trailing text (`7.2.0-rc1`) is ignored, a missing patch is 0.
pub(super) fn parse(version: &str) -> Option<(u32, u32, u32)> {
    fn number(part: &str) -> Option<u32> {
        let end = part
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(part.len());
        part[..end].parse().ok()
    }
    let mut parts = version.trim().split('.');
    let major = number(parts.next()?)?;
    let minor = number(parts.next()?)?;
    let patch = parts.next().and_then(number).unwrap_or(0);
    Some((major, minor, patch))
}

/// `redis_version` in an `INFO server` answer.
pub(super) fn redis_version(info: &str) -> Option<&str> {
    info.lines()
        .find_map(|line| line.strip_prefix("redis_version:"))
        .map(str::trim)
}

/// Whether a server reporting `version` is one inflight supports; the reason when it is not. A version
/// it cannot read passes: a Redis-compatible server may report its own.
pub(super) fn supported(version: &str) -> Result<(), String> {
    match parse(version) {
        Some(found) if found < OLDEST => Err(format!(
            "Redis {version} is older than {}.{}, the oldest inflight supports",
            OLDEST.0, OLDEST.1
        )),
        _ => Ok(()),
    }
}

/// Checks the `INFO server` answers of the servers behind a connection (one each).
pub(super) fn check(infos: &[String]) -> RedisResult<()> {
    for version in infos.iter().filter_map(|info| redis_version(info)) {
        supported(version).map_err(|why| {
            RedisError::from((ErrorKind::InvalidClientConfig, "unsupported Redis", why))
        })?;
    }
    Ok(())
}

/// Checks the answers to `INFO server` (`asked`): an error the server gives (a user whose ACL denies
/// INFO, INFO renamed away) skips the check, with a warning; a connection's error is returned, and the
/// check made again on the next command.
pub(super) fn checked(asked: RedisResult<Vec<String>>) -> RedisResult<()> {
    match asked {
        Ok(infos) => check(&infos),
        Err(error) if matches!(error.code(), Some("NOPERM" | "ERR")) => {
            tracing::warn!(%error, "cannot read the Redis version (INFO server); not checked");
            Ok(())
        }
        Err(error) => Err(error),
    }
}

/// `INFO server` of the one server behind `conn`, checked.
pub(super) async fn check_one(mut conn: impl ConnectionLike) -> RedisResult<()> {
    let asked = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await;
    checked(asked.map(|info: Value| texts(info)))
}

/// The texts of an INFO answer: one, or one per node (a cluster's answer, keyed by node).
pub(super) fn texts(value: Value) -> Vec<String> {
    fn add(value: Value, out: &mut Vec<String>) {
        match value {
            Value::BulkString(bytes) => out.push(String::from_utf8_lossy(&bytes).into_owned()),
            Value::VerbatimString { text, .. } => out.push(text),
            Value::SimpleString(text) => out.push(text),
            Value::Map(pairs) => pairs.into_iter().for_each(|(_, v)| add(v, out)),
            Value::Array(values) => values.into_iter().for_each(|v| add(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    add(value, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_below_6_2_are_refused_with_the_reason() {
        assert_eq!(parse("6.2.14"), Some((6, 2, 14)));
        assert_eq!(parse("7.2.4-rc1"), Some((7, 2, 4)));
        assert_eq!(parse("8.0"), Some((8, 0, 0)));
        assert_eq!(parse("255.255.255"), Some((255, 255, 255)));
        assert_eq!(parse("unknown"), None);
        assert_eq!(parse("7"), None);
        for ok in [
            "6.2.0", "6.2.14", "6.10.0", "7.0.15", "7.2.4", "8.0.2", "10.0.0", "?",
        ] {
            assert_eq!(supported(ok), Ok(()), "{ok}");
        }
        for old in ["6.0.9", "6.1.99", "5.0.14", "4.0.0", "2.8.24"] {
            assert_eq!(
                supported(old),
                Err(format!(
                    "Redis {old} is older than 6.2, the oldest inflight supports"
                )),
                "{old}"
            );
        }
    }

    #[test]
    fn the_version_is_read_from_info_server() {
        let info = "# Server\r\nredis_version:6.0.9\r\nredis_git_sha1:00000000\r\nredis_mode:standalone\r\n";
        assert_eq!(redis_version(info), Some("6.0.9"));
        assert_eq!(redis_version("# Server\r\nredis_mode:standalone\r\n"), None);
        let refused = check(&[info.to_owned()]).unwrap_err().to_string();
        assert!(
            refused.contains("Redis 6.0.9 is older than 6.2, the oldest inflight supports"),
            "{refused}"
        );
        // A cluster's answer: one per primary; any one too old refuses.
        let new = "redis_version:7.0.15\r\n".to_owned();
        let cluster = Value::Map(vec![
            (
                Value::SimpleString("a:1".into()),
                Value::BulkString(new.clone().into_bytes()),
            ),
            (
                Value::SimpleString("b:2".into()),
                Value::BulkString(info.as_bytes().to_vec()),
            ),
        ]);
        assert_eq!(texts(cluster.clone()).len(), 2);
        assert!(check(&texts(cluster)).is_err());
        assert!(check(&[new]).is_ok());
        // No version to read: let it be.
        assert!(check(&["# Server\r\n".to_owned()]).is_ok());
    }

    #[test]
    fn a_server_that_will_not_say_is_not_refused() {
        let noperm = redis::make_extension_error("NOPERM".into(), Some("no INFO".into()));
        assert!(checked(Err(noperm)).is_ok());
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(checked(Err(io)).is_err());
    }
}
