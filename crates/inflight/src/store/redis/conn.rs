//! The store's one way to Redis, whatever the deployment: one server (a [`ConnectionManager`]), a
//! Redis Cluster (redis-rs's cluster client, which follows MOVED/ASK and reloads its slot map), or a
//! primary found through Sentinel (`sentinel.rs`, which follows failovers). The rest of the store sends
//! commands through [`Conn`] and does not care which.

use std::sync::Arc;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Client, Cmd, Pipeline, RedisFuture, RedisResult, Value};

use super::sentinel::Follower;

/// A connection to the store's Redis; clones share it.
#[derive(Clone)]
pub(super) enum Conn {
    /// One Redis server.
    Single {
        manager: ConnectionManager,
        /// For the subscription of the view of overrides.
        client: Arc<Client>,
    },
    /// A Redis Cluster.
    Cluster {
        conn: ClusterConnection,
        /// One client per node given in the URL: the subscription goes through one, then the next.
        seeds: Arc<[Client]>,
    },
    /// The primary that Sentinel names, followed through failovers.
    Sentinel(Arc<Follower>),
}

impl Conn {
    /// True on a Redis Cluster: keys in different slots may not meet in one script.
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster { .. })
    }

    /// Sends `cmd` to the primary that serves `slot` on a cluster (through the cluster client's own
    /// slot map), to the one server otherwise.
    pub(super) async fn on_primary_of(&self, slot: u16, cmd: &Cmd) -> RedisResult<Value> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        match self {
            Conn::Cluster { conn, .. } => {
                let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                let mut conn = conn.clone();
                conn.route_command(cmd.clone(), RoutingInfo::SingleNode(route))
                    .await
            }
            other => cmd.query_async(&mut other.clone()).await,
        }
    }

    /// A client to subscribe with, for the `attempt`th try: PUBLISH reaches every node of a cluster,
    /// so any node will do, and a node that fails makes the next attempt use the next one.
    pub(super) async fn pubsub_client(&self, attempt: usize) -> RedisResult<Client> {
        match self {
            Conn::Single { client, .. } => Ok(Client::clone(client)),
            Conn::Cluster { seeds, .. } => Ok(seeds[attempt % seeds.len()].clone()),
            Conn::Sentinel(follower) => follower.client().await,
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single { manager, .. } => manager.req_packed_command(cmd),
            Conn::Cluster { conn, .. } => conn.req_packed_command(cmd),
            Conn::Sentinel(follower) => Box::pin(follower.command(cmd)),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single { manager, .. } => manager.req_packed_commands(pipeline, offset, count),
            Conn::Cluster { conn, .. } => conn.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(follower) => Box::pin(follower.pipeline(pipeline, offset, count)),
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
