//! The reverse proxy against a real upstream and a real client, on the memory and the Redis store.
//!
//! By theme: forwarding requests and limiting them (forwarding.rs), the connections to the upstream
//! and what it answers (upstream.rs), shutdown (shutdown.rs), the fencing token sent upstream
//! (token.rs), where waiting requests queue: `--priority` and `--flow` (queue.rs), and who holds a slot,
//! revoked: `--holder` and `--on-revoke` (holders.rs).
#![allow(missing_docs)]

#[path = "../common/mod.rs"]
mod common;
mod forwarding;
mod holders;
mod queue;
mod shutdown;
mod token;
mod upstream;

use inflight_server::Settings;
use reqwest::Client;

use common::{proxy_settings, start_proxy, Make, TestRedis, Upstream};

const KEY: &str = "x-inflight-key";

/// `GET url` with the key header.
async fn keyed(http: &Client, url: String, key: &str) -> reqwest::Response {
    http.get(url).header(KEY, key).send().await.unwrap()
}

/// A store, an upstream and a proxy in front of it with these settings.
async fn proxied<M: Make>(args: Settings) -> (Option<TestRedis>, Upstream, common::Server<M::S>) {
    let redis = M::redis();
    let upstream = Upstream::start().await;
    let server = start_proxy(&proxy_settings(&upstream.base, args), M::stores(&redis)).await;
    (redis, upstream, server)
}
