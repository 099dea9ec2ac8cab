//! The proxy's keys formed from each request (`--key`), `--on-missing-key` and `--limit-path`, against a
//! real upstream and a real client.
//!
//! By theme: keys from headers and templates (headers.rs), limited paths and path keys (paths.rs),
//! and the bearer token's hash as the key (bearer.rs).
#![allow(missing_docs)]

mod bearer;
#[path = "../common/mod.rs"]
mod common;
mod headers;
mod paths;

use std::io::{Read, Write};

use inflight_server::{ProxySettings, Settings};
use reqwest::{Client, StatusCode};
use serde_json::Value;

use common::{proxy_settings, start_proxy, Make, TestRedis, Upstream};

/// A store, an upstream and a proxy in front of it, its settings changed by `change`.
async fn proxied<M: Make>(
    serve: Settings,
    change: impl FnOnce(&mut ProxySettings),
) -> (Option<TestRedis>, Upstream, common::Server<M::S>) {
    let redis = M::redis();
    let upstream = Upstream::start().await;
    let mut settings = proxy_settings(&upstream.base, serve);
    change(&mut settings);
    let server = start_proxy(&settings, M::stores(&redis)).await;
    (redis, upstream, server)
}

fn templates(settings: &mut ProxySettings, keys: &[&str]) {
    settings.key = keys.iter().map(|key| (*key).to_owned()).collect();
}

/// `GET url` with these headers (a name given twice is sent twice).
async fn get(http: &Client, url: String, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut request = http.get(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.unwrap()
}

async fn code_of(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    (status, response.json::<Value>().await.unwrap_or_default())
}

/// The status of `GET target` sent as written (clients such as reqwest would resolve `.` and `..`).
fn raw_status(base: &str, target: &str, key: &str) -> u16 {
    let mut tcp = std::net::TcpStream::connect(base.trim_start_matches("http://")).unwrap();
    let request = format!(
        "GET {target} HTTP/1.1\r\nHost: x\r\nX-Inflight-Key: {key}\r\nConnection: close\r\n\r\n"
    );
    tcp.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).unwrap();
    answer
        .split(' ')
        .nth(1)
        .and_then(|status| status.parse().ok())
        .unwrap_or_else(|| panic!("no status in {answer:?}"))
}
