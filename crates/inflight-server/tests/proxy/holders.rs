//! `--holder` and `--on-revoke`: a proxied request's permit listed with its label
//! (`GET /v1/keys/{key}/permits`), and revoked (`DELETE .../permits/{id}?revoke=true`): its slot is free
//! at once, and its response ends at the permit's next renewal (`end`, the default: cut short, or 409
//! `revoked` before the upstream answered) or runs to its end (`finish`).
//!
//! Each test's key has a class of its own, so that `inflight_proxy_streams_revoked_total{class}` counts
//! its requests alone (the counter is the test process's, shared by every server in it). Waits are
//! bounded polls of what the test waits for, never a measured time.

use std::future::Future;
use std::time::Duration;

use inflight_server::config::LimitRule;
use reqwest::{Client, StatusCode};
use serde_json::Value;

use crate::common::{
    self, get_json, limits, metric_sum, proxy_settings, start_proxy, Make, TestRedis, Upstream,
};
use crate::per_store;
use crate::KEY;

/// The longest any awaited outcome may take before the test gives up: far more than a renewal.
const BOUND: Duration = Duration::from_secs(20);

/// A proxy with leases of 300 ms (renewed every 100 ms), a limit of 1 on its own key and `--holder`.
struct Holding<M: Make> {
    _redis: Option<TestRedis>,
    upstream: Upstream,
    server: common::Server<M::S>,
    http: Client,
    key: String,
}

impl<M: Make> Holding<M> {
    async fn start(test: &str, holder: &str, on_revoke: &str) -> Self {
        let redis = M::redis();
        let store = if redis.is_some() { "redis" } else { "memory" };
        let key = format!("{test}-{store}");
        let upstream = Upstream::start().await;
        let mut serve = limits(1, 0);
        serve.lease = Duration::from_millis(300);
        serve.limits = vec![LimitRule::parse(&format!("{key}=1")).unwrap()];
        let mut settings = proxy_settings(&upstream.base, serve);
        settings.holder = Some(holder.to_owned());
        settings.on_revoke = on_revoke.to_owned();
        // Not what ends a request here: the revocation is.
        settings.upstream_timeout = Duration::from_secs(60);
        let server = start_proxy(&settings, M::stores(&redis)).await;
        Self {
            _redis: redis,
            upstream,
            server,
            http: Client::new(),
            key,
        }
    }

    /// `GET path` under the key, with `headers`.
    fn get(&self, path: &str, headers: &[(&str, &str)]) -> reqwest::RequestBuilder {
        let mut request = self.http.get(self.server.url(path)).header(KEY, &self.key);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request
    }

    /// A stream of `path` under the key, its first event read.
    async fn stream(&self, path: &str, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut stream = self.get(path, headers).send().await.unwrap();
        assert_eq!(stream.status(), StatusCode::OK);
        assert!(
            stream.chunk().await.unwrap().is_some(),
            "the stream started"
        );
        stream
    }

    /// The key's first page of holders and waiters, as the API lists them.
    async fn page(&self) -> Value {
        let url = self
            .server
            .url(&format!("/_inflight/v1/keys/{}/permits", self.key));
        get_json(&self.http, url).await
    }

    /// The key's holders, as the API lists them.
    async fn holders(&self) -> Vec<Value> {
        let page = self.page().await;
        page["holders"].as_array().expect("holders").clone()
    }

    /// Polls until the key lists a holder, and returns it.
    async fn listed(&self) -> Value {
        bounded("a holder is listed", async {
            loop {
                if let Some(holder) = self.holders().await.pop() {
                    return holder;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
    }

    /// Revokes the holder `id`: 204.
    async fn revoke(&self, id: &str) {
        let url = format!("/_inflight/v1/keys/{}/permits/{id}?revoke=true", self.key);
        let revoked = self
            .http
            .delete(self.server.url(&url))
            .send()
            .await
            .unwrap();
        assert_eq!(revoked.status(), StatusCode::NO_CONTENT);
    }

    /// Requests the proxy ended because their permit was revoked, in this test's class.
    async fn ended(&self) -> f64 {
        let metrics = self.server.url("/_inflight/metrics");
        let class = format!("class=\"{}\"", self.key);
        metric_sum(
            &self.http,
            &metrics,
            "inflight_proxy_streams_revoked_total",
            &class,
        )
        .await
    }

    /// Polls until `ended` counts `want`.
    async fn counted(&self, want: f64) {
        bounded("the revoked request is counted", async {
            while self.ended().await != want {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
    }

    /// The key's slot is free: a request is admitted, and forwarded.
    async fn admits(&self) {
        let admitted = self.get("/echo/after", &[]).send().await.unwrap();
        assert_eq!(admitted.status(), StatusCode::OK, "the slot is free");
    }
}

/// `future`'s output, or a panic naming `what` once [`BOUND`] has passed.
async fn bounded<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {BOUND:?}"))
}

async fn a_revoked_stream_ends_at_its_next_renewal<M: Make>() {
    let h = Holding::<M>::start("revoked-stream", "{client_ip}", "end").await;
    let mut stream = h.stream("/forever", &[]).await;
    let holder = h.listed().await;
    assert_eq!(holder["holder"], "127.0.0.1", "{holder}");
    let refused = h.get("/echo/before", &[]).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS, "held");
    h.revoke(holder["id"].as_str().unwrap()).await;
    // Free at once, whether or not the proxy has heard yet.
    h.admits().await;
    // The endless stream breaks off: an error, never a clean end.
    let end = bounded("the stream ends", async {
        loop {
            match stream.chunk().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await;
    assert!(end.is_err(), "cut short, not finished: {end:?}");
    // The upstream's connection was dropped with it, so its stream ended too.
    bounded("the upstream's stream ends", async {
        while h.upstream.ended() < 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    h.counted(1.0).await;
    assert!(h.holders().await.is_empty(), "{:?}", h.holders().await);
    h.admits().await;
}

async fn a_request_revoked_before_its_upstream_answered_is_409<M: Make>() {
    let h = Holding::<M>::start("revoked-early", "user:{header:X-User}", "end").await;
    let hits = h.upstream.hits();
    let waiting = h.get("/slow", &[("x-user", "ann")]).send();
    let waiting = tokio::spawn(waiting);
    let holder = h.listed().await;
    // Waiting for the upstream's headers (which take 30 s).
    bounded("the request reaches the upstream", async {
        while h.upstream.hits() == hits {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(holder["holder"], "user:ann", "{holder}");
    h.revoke(holder["id"].as_str().unwrap()).await;
    let answer = bounded("the request is answered", waiting).await;
    let answer = answer.unwrap().unwrap();
    assert_eq!(answer.status(), StatusCode::CONFLICT);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["code"], "revoked", "{body}");
    assert_eq!(h.upstream.hits(), hits + 1, "it was forwarded once");
    h.counted(1.0).await;
    h.admits().await;
}

async fn with_on_revoke_finish_a_revoked_stream_runs_to_its_end<M: Make>() {
    let h = Holding::<M>::start("revoked-finish", "{client_ip}", "finish").await;
    let mut stream = h.stream("/sse", &[]).await;
    let holder = h.listed().await;
    h.revoke(holder["id"].as_str().unwrap()).await;
    h.admits().await;
    // Several renewals later (each a third of the 300 ms lease) the proxy has heard it, and lets the
    // stream go on: the events the upstream sends still come, and the stream ends cleanly.
    tokio::time::sleep(Duration::from_millis(600)).await;
    h.upstream.gate.add_permits(2);
    for event in 1..3 {
        let chunk = bounded("the next event", stream.chunk()).await;
        assert_eq!(chunk.unwrap().unwrap(), format!("data: {event}\n\n"));
    }
    let end = bounded("the stream ends", stream.chunk()).await;
    assert!(end.unwrap().is_none(), "finished");
    assert_eq!(h.ended().await, 0.0, "nothing was ended");
    h.admits().await;
}

async fn labels_are_formed_as_keys_are_and_checked<M: Make>() {
    let h = Holding::<M>::start("labels", "user:{header:X-User}/{bearer_hash}", "end").await;
    let hits = h.upstream.hits();
    // Too long: refused before anything is held or forwarded, never cut short.
    let long = "u".repeat(200);
    let bearer = ("authorization", "Bearer abc");
    let refused = h.get("/echo/long", &[("x-user", long.as_str()), bearer]);
    let refused = refused.send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "invalid_holder", "{body}");
    assert_eq!(h.upstream.hits(), hits, "nothing was forwarded");
    // The bearer token is only ever its hash (SHA-256("abc")).
    let stream = h.stream("/sse", &[("x-user", "ann"), bearer]).await;
    let holder = h.listed().await;
    assert_eq!(holder["holder"], "user:ann/ba7816bf8f01cfea", "{holder}");
    h.upstream.gate.add_permits(2);
    drop(stream);
    bounded("the slot is released", async {
        while !h.holders().await.is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // Nothing in the request for the template: admitted all the same, without a label (on the memory
    // store such a permit has no lease, and is counted as held without being listed).
    let _unlabelled = h.stream("/sse", &[]).await;
    let page = h.page().await;
    let holders = page["holders"].as_array().expect("holders");
    assert!(holders.iter().all(|h| h.get("holder").is_none()), "{page}");
    let unlisted = page["unlisted"].as_u64().unwrap_or(0);
    assert_eq!(holders.len() as u64 + unlisted, 1, "{page}");
}

per_store!(
    a_revoked_stream_ends_at_its_next_renewal,
    a_request_revoked_before_its_upstream_answered_is_409,
    with_on_revoke_finish_a_revoked_stream_runs_to_its_end,
    labels_are_formed_as_keys_are_and_checked,
);
