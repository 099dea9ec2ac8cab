//! [`Conn`], the store's one way to Redis, whatever the deployment: one server (a
//! [`ConnectionManager`]), a Redis Cluster, or a primary found through Sentinel.

use std::sync::Arc;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Client, Cmd, IntoConnectionInfo, Pipeline, RedisFuture, RedisResult, Value};
use tokio::sync::OnceCell;

use super::options::{client, invalid_url, strip_scheme, ConnOptions};
use super::sentinel::Follower;
use super::{cluster, version};
use crate::error::StoreError;

/// A connection to the store's Redis; clones share it.
#[derive(Clone)]
pub(crate) struct Conn {
    to: To,
    /// Set once the servers' version passed ([`version`]), before the first command (through Sentinel,
    /// at once: each primary is checked as it is followed).
    checked: Arc<OnceCell<()>>,
}

#[derive(Clone)]
enum To {
    /// One Redis server, and its client for the subscription of the view of overrides.
    Single(ConnectionManager, Arc<Client>),
    /// A Redis Cluster, and one client per node given in the URL: the subscription goes through one,
    /// then the next.
    Cluster(ClusterConnection, Arc<[Client]>),
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
        let (to, target) = if let Some((rest, scheme)) = strip_scheme(&options.url, "cluster") {
            let (conn, seeds, target) = cluster::open(options, rest, scheme)?;
            (To::Cluster(conn, seeds.into()), target)
        } else if let Some((rest, scheme)) = strip_scheme(&options.url, "sentinel") {
            let (follower, target) = Follower::open(options, rest, scheme)?;
            (To::Sentinel(follower), target)
        } else {
            // One server: `redis://`, `rediss://`, `unix://`, `redis+unix://`.
            let info = options.url.as_str().into_connection_info();
            let info = info.map_err(invalid_url)?;
            let target = info.addr().to_string();
            let client = client(info, options.root_cert.as_deref())?;
            let manager =
                ConnectionManager::new_lazy_with_config(client.clone(), options.manager_config())
                    .map_err(StoreError::from)?;
            (To::Single(manager, Arc::new(client)), target)
        };
        let checked = OnceCell::new_with(matches!(to, To::Sentinel(_)).then_some(()));
        let checked = Arc::new(checked);
        Ok((Conn { to, checked }, target))
    }

    /// True on a Redis Cluster: keys in different slots may not meet in one script.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.to, To::Cluster(..))
    }

    /// Checks, once, that the servers are a version inflight supports (the one server, or every
    /// primary of a cluster); a connection's error leaves it to the next command.
    async fn supported(&self) -> RedisResult<()> {
        let check = || async {
            match &self.to {
                To::Single(manager, _) => version::check_one(manager.clone()).await,
                // INFO goes to every primary and fails when one cannot answer (down, failing over):
                // that must not stop the commands of the others' slots, so the check is then skipped.
                To::Cluster(..) => match self.info("server").await {
                    Ok(infos) => version::check(&infos),
                    Err(error) => {
                        tracing::warn!(%error, "cannot read every primary's Redis version; not checked");
                        Ok(())
                    }
                },
                To::Sentinel(_) => Ok(()),
            }
        };
        self.checked.get_or_try_init(check).await.map(drop)
    }

    /// Sends `cmd` to the primary that serves `slot` on a cluster, to the one server otherwise.
    pub(crate) async fn on_primary_of(&self, slot: u16, cmd: &Cmd) -> RedisResult<Value> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        match &self.to {
            To::Cluster(conn, _) => {
                self.supported().await?;
                let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                let mut conn = conn.clone();
                conn.route_command(cmd.clone(), RoutingInfo::SingleNode(route))
                    .await
            }
            _ => cmd.query_async(&mut self.clone()).await,
        }
    }

    /// `INFO section` of every primary (of the one server, or the one Sentinel names): each one's text.
    pub(crate) async fn info_of_primaries(&self, section: &str) -> RedisResult<Vec<String>> {
        self.supported().await?;
        self.info(section).await
    }

    /// `INFO section` of every primary; on a cluster, without the version check.
    async fn info(&self, section: &str) -> RedisResult<Vec<String>> {
        use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
        let mut cmd = redis::cmd("INFO");
        cmd.arg(section);
        let answer = match &self.to {
            To::Cluster(conn, _) => {
                let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                // One reply per primary, keyed by its address.
                conn.clone().route_command(cmd, all).await?
            }
            _ => cmd.query_async(&mut self.clone()).await?,
        };
        Ok(version::texts(answer))
    }

    /// A client to subscribe with, for the `attempt`th try: PUBLISH reaches every node of a cluster,
    /// so any node will do, and a node that fails makes the next attempt use the next one.
    pub(crate) async fn pubsub_client(&self, attempt: usize) -> RedisResult<Client> {
        match &self.to {
            To::Single(_, client) => Ok(Client::clone(client)),
            To::Cluster(_, seeds) => Ok(seeds[attempt % seeds.len()].clone()),
            To::Sentinel(follower) => follower.client().await,
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        if !self.checked.initialized() {
            return Box::pin(async move {
                self.supported().await?;
                self.req_packed_command(cmd).await
            });
        }
        match &mut self.to {
            To::Single(manager, _) => manager.req_packed_command(cmd),
            To::Cluster(conn, _) => conn.req_packed_command(cmd),
            To::Sentinel(follower) => Box::pin(
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
        if !self.checked.initialized() {
            return Box::pin(async move {
                self.supported().await?;
                self.req_packed_commands(pipeline, offset, count).await
            });
        }
        match &mut self.to {
            To::Single(manager, _) => manager.req_packed_commands(pipeline, offset, count),
            To::Cluster(conn, _) => conn.req_packed_commands(pipeline, offset, count),
            To::Sentinel(follower) => Box::pin(follower.send(move |mut manager| async move {
                manager.send_packed_commands(pipeline, offset, count).await
            })),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.to {
            To::Single(manager, _) => manager.get_db(),
            To::Cluster(..) => 0,
            To::Sentinel(follower) => follower.db(),
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
