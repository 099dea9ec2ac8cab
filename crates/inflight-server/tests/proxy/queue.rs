//! `--priority` and `--flow`: where a waiting proxied request queues, formed from each request's headers;
//! a bad level or flow is refused 400 on every request, waiting or not, with nothing held or forwarded.
//!
//! The order of admissions is read from the fencing tokens the proxy forwards (`--forward-token`): they
//! grow with each admission on a key, and with a limit of 1 each waiter is admitted only once the one
//! before it is done.

use std::time::{Duration, Instant};

use inflight_server::config::LimitRule;
use reqwest::{Client, StatusCode};
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::common::{
    self, limits, metric_sum, proxy_settings, start_proxy, Make, TestRedis, Upstream,
};
use crate::per_store;
use crate::KEY;

/// A proxy with a limit of 1 on its key, `--priority '{header:X-Priority}'` and
/// `--flow 'tenant:{header:X-Tenant}'`.
struct Queueing<M: Make> {
    redis: Option<TestRedis>,
    upstream: Upstream,
    server: common::Server<M::S>,
    http: Client,
    /// The key, of a class of its own, so that `inflight_waiting{class}` counts this test's waiters
    /// alone (the gauge is the test process's, shared by every server in it).
    key: String,
}

impl<M: Make> Queueing<M> {
    async fn start(test: &str, max_wait: Duration) -> Self {
        let redis = M::redis();
        let store = if redis.is_some() { "redis" } else { "memory" };
        let key = format!("{test}-{store}");
        let upstream = Upstream::start().await;
        let mut serve = limits(1, 0);
        serve.limits = vec![LimitRule::parse(&format!("{key}=1")).unwrap()];
        let mut settings = proxy_settings(&upstream.base, serve);
        settings.max_wait = max_wait;
        settings.forward_token = true;
        settings.priority = Some("{header:X-Priority}".to_owned());
        settings.flow = Some("tenant:{header:X-Tenant}".to_owned());
        let server = start_proxy(&settings, M::stores(&redis)).await;
        Self {
            redis,
            upstream,
            server,
            http: Client::new(),
            key,
        }
    }

    /// Takes the key's one slot with a stream that runs until [`Queueing::release`].
    async fn hold(&self) -> reqwest::Response {
        let held = self
            .http
            .get(self.server.url("/sse"))
            .header(KEY, &self.key);
        let mut held = held.send().await.unwrap();
        assert_eq!(held.status(), StatusCode::OK);
        assert!(
            held.headers().get("inflight-limit").is_none(),
            "admitted at once"
        );
        assert!(held.chunk().await.unwrap().is_some(), "the stream started");
        held
    }

    async fn release(&self, mut held: reqwest::Response) {
        self.upstream.gate.add_permits(2);
        while held.chunk().await.unwrap().is_some() {}
    }

    /// A request named `name` with `headers`, waiting for the slot: its admission's token and its name.
    fn wait(&self, name: &str, headers: &[(&str, &str)]) -> JoinHandle<(u64, String)> {
        let url = self.server.url(&format!("/echo/{name}"));
        let mut request = self.http.get(url).header(KEY, &self.key);
        for (header, value) in headers {
            request = request.header(*header, *value);
        }
        let name = name.to_owned();
        // Admitted after it queued: the answer names the limit it waited on.
        let named = format!(
            "key=\"{}\"; class=\"{}\"; limit=1; in_flight=1",
            self.key, self.key
        );
        tokio::spawn(async move {
            let answer = request.timeout(Duration::from_secs(60)).send().await;
            let answer = answer.unwrap();
            assert_eq!(answer.status(), StatusCode::OK, "{name}");
            assert_eq!(answer.headers()["inflight-limit"], named.as_str(), "{name}");
            let echo: Value = answer.json().await.unwrap();
            let token = echo["headers"]["inflight-token"].as_str().unwrap();
            (token.parse().unwrap(), name)
        })
    }

    /// The requests waiting on the key: its queue's tickets on Redis; on the memory store, the proxy's
    /// `inflight_waiting` of the key's class (counted as the waiter asks, in the same poll that
    /// queues its ticket there).
    async fn queued(&self) -> usize {
        match &self.redis {
            Some(redis) => ::redis::cmd("ZCARD")
                .arg(format!("inflight:{{{}}}:queue", self.key))
                .query(&mut redis.client())
                .unwrap(),
            None => {
                let metrics = self.server.url("/_inflight/metrics");
                let class = format!("class=\"{}\"", self.key);
                metric_sum(&self.http, &metrics, "inflight_waiting", &class).await as usize
            }
        }
    }

    /// Waits (at most 20 s) until `n` requests wait on the key.
    async fn until_queued(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let queued = self.queued().await;
            if queued == n {
                return;
            }
            assert!(Instant::now() < deadline, "{queued} waiting, not {n}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The names of `waiters` in the order they were admitted.
    async fn admitted(&self, waiters: Vec<JoinHandle<(u64, String)>>) -> Vec<String> {
        let mut admitted = Vec::new();
        for waiter in waiters {
            let bounded = tokio::time::timeout(Duration::from_secs(60), waiter);
            admitted.push(bounded.await.expect("every waiter admitted").unwrap());
        }
        admitted.sort();
        admitted.into_iter().map(|(_, name)| name).collect()
    }
}

/// Waiters queued one after another at levels 0 (no header: the default), 0, 1 and 9: the later, higher
/// levels pass the earlier, lower ones.
async fn a_higher_priority_header_passes_the_queue<M: Make>() {
    let proxy = Queueing::<M>::start("priority", Duration::from_secs(60)).await;
    let held = proxy.hold().await;
    let levels = [None, Some("0"), Some("1"), Some("9")];
    let mut waiters = Vec::new();
    for (n, level) in levels.into_iter().enumerate() {
        let headers: Vec<(&str, &str)> = level
            .map(|level| ("x-priority", level))
            .into_iter()
            .collect();
        waiters.push(proxy.wait(&format!("w{n}"), &headers));
        proxy.until_queued(n + 1).await;
    }
    proxy.release(held).await;
    let order = proxy.admitted(waiters).await;
    assert_eq!(order, ["w3", "w2", "w0", "w1"]);
    assert_eq!(proxy.queued().await, 0);
}

/// Six waiters of tenant a, then one of tenant b: b's is admitted within two admissions.
async fn a_flow_with_one_waiter_is_not_kept_behind_anothers_many<M: Make>() {
    let proxy = Queueing::<M>::start("flow", Duration::from_secs(60)).await;
    let held = proxy.hold().await;
    let mut waiters = Vec::new();
    for n in 0..7 {
        let tenant = if n == 6 { "b" } else { "a" };
        waiters.push(proxy.wait(&format!("{tenant}{n}"), &[("x-tenant", tenant)]));
        proxy.until_queued(n + 1).await;
    }
    proxy.release(held).await;
    let order = proxy.admitted(waiters).await;
    let b = order.iter().position(|name| name == "b6").unwrap();
    assert!(
        b < 2,
        "tenant b admitted after {b} of tenant a's 6: {order:?}"
    );
}

/// A level that is no whole number from 0 to 255, or a flow over 256 bytes: 400 with its code, whether
/// the proxy lets requests wait or not, nothing forwarded, charged, held or queued.
async fn a_bad_priority_or_flow_is_refused_on_every_request<M: Make>() {
    for (test, max_wait) in [
        ("bad", Duration::ZERO),
        ("bad-waiting", Duration::from_secs(60)),
    ] {
        let proxy = Queueing::<M>::start(test, max_wait).await;
        let long = "f".repeat(257);
        let cases = [
            (("x-priority", "abc"), "invalid_priority"),
            (("x-priority", "256"), "invalid_priority"),
            (("x-priority", "-1"), "invalid_priority"),
            (("x-tenant", long.as_str()), "invalid_flow"),
        ];
        for ((header, value), code) in cases {
            let request = proxy.http.get(proxy.server.url("/echo/bad"));
            let request = request.header(KEY, &proxy.key).header(header, value);
            let answer = request.send().await.unwrap();
            assert_eq!(
                answer.status(),
                StatusCode::BAD_REQUEST,
                "{header}: {value}"
            );
            let body: Value = answer.json().await.unwrap();
            assert_eq!(body["code"], code, "{header}: {value}");
            assert!(body["message"].as_str().unwrap().len() > 10, "{body}");
        }
        assert_eq!(proxy.upstream.hits(), 0, "nothing forwarded");
        assert_eq!(proxy.server.in_flight(&proxy.key).await, 0, "nothing held");
        assert_eq!(proxy.queued().await, 0, "nothing queued");
        // The longest flow and the highest level pass, at once with the slot free.
        let longest = "f".repeat(256 - "tenant:".len());
        let request = proxy.http.get(proxy.server.url("/echo/good"));
        let request = request.header(KEY, &proxy.key).header("x-priority", "255");
        let answer = request.header("x-tenant", longest).send().await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
    }
}

per_store!(
    a_higher_priority_header_passes_the_queue,
    a_flow_with_one_waiter_is_not_kept_behind_anothers_many,
    a_bad_priority_or_flow_is_refused_on_every_request
);
