//! `--forward-token`: each admitted request's fencing token goes upstream in `Inflight-Token`, in
//! place of any the client sent, and grows from request to request on a key.

use common::{proxy_settings, start_proxy, Make, Upstream};
use inflight_server::ProxySettings;
use reqwest::Client;
use serde_json::Value;

use crate::common::{self, limits};
use crate::per_store;

async fn echoed(http: &Client, url: String, key: &str) -> Value {
    let answer = http.get(url).header("x-inflight-key", key);
    let answer = answer.header("inflight-token", "999999999999999999");
    answer.send().await.unwrap().json().await.unwrap()
}

async fn the_token_of_each_admission_goes_upstream_when_asked<M: Make>() {
    let redis = M::redis();
    let upstream = Upstream::start().await;
    let http = Client::new();
    let forwarding: ProxySettings = {
        let mut settings = proxy_settings(&upstream.base, limits(5, 0));
        settings.forward_token = true;
        settings
    };
    let server = start_proxy(&forwarding, M::stores(&redis)).await;
    let mut last = 0;
    for _ in 0..3 {
        let echo = echoed(&http, server.url("/echo/x"), "k").await;
        let token: u64 = echo["headers"]["inflight-token"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            token > last && token != 999_999_999_999_999_999,
            "{token} after {last}"
        );
        last = token;
    }
    // Off by default: the proxy adds nothing (and leaves the client's header alone).
    let plain = proxy_settings(&upstream.base, limits(5, 0));
    let server = start_proxy(&plain, M::stores(&redis)).await;
    let echo = echoed(&http, server.url("/echo/x"), "k").await;
    assert_eq!(echo["headers"]["inflight-token"], "999999999999999999");
}

per_store!(the_token_of_each_admission_goes_upstream_when_asked);
