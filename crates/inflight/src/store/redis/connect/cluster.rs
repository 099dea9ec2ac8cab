//! Redis Cluster: `redis+cluster://[user:password@]host:port,host:port,...` (`rediss+cluster://` for
//! TLS), through redis-rs's cluster client, which routes each command by its first key's slot, follows
//! MOVED and ASK, and reloads its slot map and a script a node lacks. It re-sends a command whose
//! connection dropped, so every script is idempotent by permit id; its retries and timeouts are set here.
//! An admission whose keys all share a slot is one script; `across.rs` takes the others.

use redis::cluster::{ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;
use redis::Client;

use super::options::{client, invalid_url, ConnOptions};
use crate::error::StoreError;

/// How many times the cluster client resends a command (after MOVED, ASK, TRYAGAIN or a lost connection).
const RETRIES: u32 = 3;

/// Splits `[user:password@]host:port,host:port[/...]` into its credentials (with their `@`), its
/// nodes and what follows the nodes (`/...`, or `""`).
pub(super) fn split_nodes(rest: &str) -> Result<(&str, Vec<&str>, &str), StoreError> {
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    let (credentials, hosts) = match authority.rfind('@') {
        Some(at) => authority.split_at(at + 1),
        None => ("", authority),
    };
    let nodes: Vec<&str> = hosts.split(',').map(str::trim).collect();
    if nodes.iter().any(|node| node.is_empty()) {
        return Err(invalid_url("an empty node in the list of nodes"));
    }
    Ok((credentials, nodes, tail))
}

/// Opens a lazy connection to the cluster, with a client of each node given (to subscribe through);
/// the target for logs names its nodes, never credentials.
pub(super) fn open(
    options: &ConnOptions,
    rest: &str,
    scheme: &str,
) -> Result<(ClusterConnection, Vec<Client>, String), StoreError> {
    let (credentials, nodes, tail) = split_nodes(rest)?;
    if !matches!(tail, "" | "/" | "/0") {
        return Err(invalid_url(
            "a cluster has database 0 only, and takes no options",
        ));
    }
    let urls: Vec<String> = nodes
        .iter()
        .map(|node| format!("{scheme}://{credentials}{node}"))
        .collect();
    let cluster = ClusterClientBuilder::new(urls.iter().map(String::as_str))
        .connection_timeout(options.connection_timeout)
        .response_timeout(options.response_timeout)
        .retries(RETRIES)
        .min_retry_wait(10)
        .max_retry_wait(100)
        .tcp_settings(TcpSettings::default().set_nodelay(true));
    #[cfg(feature = "tls")]
    let cluster = match &options.root_cert {
        Some(pem) => cluster.certs(redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem.clone()),
        }),
        None => cluster,
    };
    let cluster = cluster.build().map_err(invalid_url)?;
    let config = ClusterConfig::new()
        .set_connection_timeout(options.connection_timeout)
        .set_response_timeout(options.response_timeout);
    let conn = cluster.get_pending_async_connection_with_config(config);
    let seeds = urls
        .iter()
        .map(|url| client(url.as_str(), options.root_cert.as_deref()))
        .collect::<Result<Vec<Client>, StoreError>>()?;
    Ok((conn, seeds, format!("cluster {}", nodes.join(","))))
}

/// The slot of a Redis key, as Redis Cluster computes it: CRC16 (XMODEM) of its hash tag (the text
/// between the first `{` and the next `}`, when not empty) or of the whole key, modulo 16384.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|b| *b == b'{').and_then(|open| {
        let close = key[open + 1..].iter().position(|b| *b == b'}')?;
        (close > 0).then(|| &key[open + 1..open + 1 + close])
    });
    crc16(tagged.unwrap_or(key)) % 16384
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc = 0u16;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::cluster_routing::Slot;

    #[test]
    fn slots_are_those_of_redis_cluster() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        // CLUSTER KEYSLOT answers these.
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"inflight:{foo}:leases"), 12182);
        assert_eq!(slot(b"{}foo"), slot(b"{}foo"));
        for key in [
            "a",
            "inflight:{app-1}:limit",
            "x{}{y}",
            "{a",
            "a}{b}",
            "ünï{ç}",
        ] {
            let ours = Slot::new(slot(key.as_bytes())).unwrap();
            assert_eq!(ours, Slot::for_key(key), "{key}");
        }
    }

    #[test]
    fn node_lists_split_into_credentials_nodes_and_the_rest() {
        let (credentials, nodes, tail) = split_nodes("u:p@a:1,b:2/0").unwrap();
        assert_eq!(
            (credentials, nodes, tail),
            ("u:p@", vec!["a:1", "b:2"], "/0")
        );
        let (credentials, nodes, tail) = split_nodes("[::1]:7000, c:3").unwrap();
        assert_eq!(
            (credentials, nodes, tail),
            ("", vec!["[::1]:7000", "c:3"], "")
        );
        assert!(split_nodes("a:1,,b:2").is_err());
        let strip = |url| super::super::options::strip_scheme(url, "cluster");
        assert_eq!(strip("rediss+cluster://a:1"), Some(("a:1", "rediss")));
        assert_eq!(strip("redis+cluster://a:1"), Some(("a:1", "redis")));
        assert_eq!(strip("redis://a:1"), None);
    }
}
