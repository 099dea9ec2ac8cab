//! [`Conn`], the store's one way to Redis, whatever the deployment: one server (a
//! [`ConnectionManager`]), a Redis Cluster, or a primary found through Sentinel.

use std::sync::Arc;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Client, Cmd, IntoConnectionInfo, Pipeline, RedisFuture, RedisResult, Value};
use tokio::sync::OnceCell;

use super::options::{client, ConnOptions};
use super::sentinel::Follower;
use super::{cluster, sentinel, version};
use crate::error::StoreError;

/// A connection to the store's Redis; clones share it.
#[derive(Clone)]
pub(crate) enum Conn {
    /// One Redis server.
    Single {
        manager: ConnectionManager,
        /// For the subscription of the view of overrides.
        client: Arc<Client>,
        /// Set once the server's version passed ([`version`]), before the first command.
        checked: Arc<OnceCell<()>>,
    },
    /// A Redis Cluster.
    Cluster {
        conn: ClusterConnection,
        /// One client per node given in the URL: the subscription goes through one, then the next.
        seeds: Arc<[Client]>,
        /// Set once every primary's version passed, before the first command.
        checked: Arc<OnceCell<()>>,
    },
    /// The primary that Sentinel names, followed through failovers.
    Sentinel(Arc<Follower>),
}

impl Conn {
    /// Checks `options`' URL and prepares the connection (made on first use, remade when lost), inside a
    /// Tokio runtime only; and where it goes, for logs (never credentials).
    pub(crate) fn open(options: &ConnOptions) -> Result<(Conn, String), StoreError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(StoreError::Rejected(
                "open a Redis store inside a Tokio runtime".into(),
            ));
        }
        if let Some((rest, tls)) = cluster::strip_scheme(&options.url) {
            let (conn, seeds, target) = cluster::open(options, rest, tls)?;
            let seeds = Arc::from(seeds);
            let checked = Arc::default();
            return Ok((
                Conn::Cluster {
                    conn,
                    seeds,
                    checked,
                },
                target,
            ));
        }
        if let Some((rest, tls)) = sentinel::strip_scheme(&options.url) {
            let (follower, target) = Follower::open(options, rest, tls)?;
            return Ok((Conn::Sentinel(follower), target));
        }
        // One server: `redis://`, `rediss://`, `unix://`, `redis+unix://`.
        let info = options
            .url
            .as_str()
            .into_connection_info()
            .map_err(|e| StoreError::Rejected(format!("invalid Redis URL: {e}")))?;
        let target = info.addr().to_string();
        let client = client(info, options.root_cert.as_deref())?;
        let manager =
            ConnectionManager::new_lazy_with_config(client.clone(), options.manager_config())
                .map_err(StoreError::from)?;
        let client = Arc::new(client);
        let checked = Arc::default();
        Ok((
            Conn::Single {
                manager,
                client,
                checked,
            },
            target,
        ))
    }

    /// True on a Redis Cluster: keys in different slots may not meet in one script.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster { .. })
    }

    /// Checks, once, that the servers are a version inflight supports (the one server, or every
    /// primary of a cluster; Sentinel's primaries are checked as they are followed); a connection's error
    /// leaves it to the next command.
    async fn supported(&self) -> RedisResult<()> {
        match self {
            Conn::Single {
                manager, checked, ..
            } => {
                let check = || version::check_one(manager.clone());
                checked.get_or_try_init(check).await?;
            }
            Conn::Cluster { conn, checked, .. } => {
                // INFO goes to every primary and fails when one cannot answer (down, failing over):
                // that must not stop the commands of the others' slots, so the check is then skipped.
                let check = || async {
                    match Self::info_of_cluster(conn, "server").await {
                        Ok(infos) => version::check(&infos),
                        Err(error) => {
                            tracing::warn!(%error, "cannot read every primary's Redis version; not checked");
                            Ok(())
                        }
                    }
                };
                checked.get_or_try_init(check).await?;
            }
            Conn::Sentinel(_) => {}
        }
        Ok(())
    }

    /// True once [`Conn::supported`] passed (always through Sentinel, which checks by itself).
    fn is_checked(&self) -> bool {
        match self {
            Conn::Single { checked, .. } | Conn::Cluster { checked, .. } => checked.initialized(),
            Conn::Sentinel(_) => true,
        }
    }

    /// Sends `cmd` to the primary that serves `slot` on a cluster, to the one server otherwise.
    pub(crate) async fn on_primary_of(&self, slot: u16, cmd: &Cmd) -> RedisResult<Value> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        match self {
            Conn::Cluster { conn, .. } => {
                self.supported().await?;
                let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                let mut conn = conn.clone();
                conn.route_command(cmd.clone(), RoutingInfo::SingleNode(route))
                    .await
            }
            other => cmd.query_async(&mut other.clone()).await,
        }
    }

    /// `INFO section` of every primary (of the one server, or the one Sentinel names): each one's text.
    pub(crate) async fn info_of_primaries(&self, section: &str) -> RedisResult<Vec<String>> {
        match self {
            Conn::Cluster { conn, .. } => {
                self.supported().await?;
                Self::info_of_cluster(conn, section).await
            }
            other => {
                let mut cmd = redis::cmd("INFO");
                cmd.arg(section);
                Ok(version::texts(cmd.query_async(&mut other.clone()).await?))
            }
        }
    }

    /// `INFO section` of every primary of a cluster, unchecked.
    async fn info_of_cluster(conn: &ClusterConnection, section: &str) -> RedisResult<Vec<String>> {
        use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
        let mut cmd = redis::cmd("INFO");
        cmd.arg(section);
        let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        // One reply per primary, keyed by its address.
        Ok(version::texts(conn.clone().route_command(cmd, all).await?))
    }

    /// A client to subscribe with, for the `attempt`th try: PUBLISH reaches every node of a cluster,
    /// so any node will do, and a node that fails makes the next attempt use the next one.
    pub(crate) async fn pubsub_client(&self, attempt: usize) -> RedisResult<Client> {
        match self {
            Conn::Single { client, .. } => Ok(Client::clone(client)),
            Conn::Cluster { seeds, .. } => Ok(seeds[attempt % seeds.len()].clone()),
            Conn::Sentinel(follower) => follower.client().await,
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        if !self.is_checked() {
            return Box::pin(async move {
                self.supported().await?;
                self.req_packed_command(cmd).await
            });
        }
        match self {
            Conn::Single { manager, .. } => manager.req_packed_command(cmd),
            Conn::Cluster { conn, .. } => conn.req_packed_command(cmd),
            Conn::Sentinel(follower) => Box::pin(
                follower
                    .send(move |mut manager| async move { manager.send_packed_command(cmd).await }),
            ),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        if !self.is_checked() {
            return Box::pin(async move {
                self.supported().await?;
                self.req_packed_commands(pipeline, offset, count).await
            });
        }
        match self {
            Conn::Single { manager, .. } => manager.req_packed_commands(pipeline, offset, count),
            Conn::Cluster { conn, .. } => conn.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(follower) => Box::pin(follower.send(move |mut manager| async move {
                manager.send_packed_commands(pipeline, offset, count).await
            })),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single { manager, .. } => manager.get_db(),
            Conn::Cluster { .. } => 0,
            Conn::Sentinel(follower) => follower.db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sentinel_and_cluster_urls_are_checked_when_opened() {
        let target =
            |url: &str| Conn::open(&ConnOptions::new(url.to_owned())).map(|(_, target)| target);
        assert_eq!(
            target("redis+sentinel://u:secret@a:1,b/mymaster?db=2&sentinel_password=s").unwrap(),
            "sentinel a:1,b/mymaster"
        );
        assert_eq!(
            target("redis+cluster://u:secret@a:1,b:2").unwrap(),
            "cluster a:1,b:2"
        );
        for bad in [
            "redis+sentinel://a:1",
            "redis+sentinel://a:1/",
            "redis+sentinel://a:1/m/x",
            "redis+sentinel://a:1/m?db=x",
            "redis+sentinel://a:1/m?tls=yes",
            "redis+sentinel://a:1,,b:2/m",
            "redis+cluster://a:1/3",
            "redis+cluster://a:1?x=1",
        ] {
            assert!(target(bad).is_err(), "{bad}");
        }
    }
}
