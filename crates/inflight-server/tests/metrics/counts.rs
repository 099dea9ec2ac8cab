//! The same work through `serve` and through `proxy` counts the same; a full wait queue is a
//! refusal; store_up follows the store.

use std::time::{Duration, Instant};

use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

use crate::common;
use crate::common::Upstream;
use crate::{proxy, serve, through_proxy, until, Scrape, WAIT_MS};

/// What the work must show, as (series, value) in the middle (A held, B timed out, C waiting) and at the
/// end (A and C released).
const MIDDLE: &[(&str, f64)] = &[
    ("inflight_admissions_total{result=\"admitted\"}", 1.0),
    ("inflight_admissions_total{result=\"rejected\"}", 1.0),
    ("inflight_admissions_total{result=\"error\"}", 0.0),
    ("inflight_releases_total", 0.0),
    ("inflight_in_flight", 1.0),
    ("inflight_waiting{class=\"default\",priority=\"0\"}", 1.0),
    // The memory store keeps a queue per key: the waiter holds a ticket.
    ("inflight_tickets{class=\"default\"}", 1.0),
    ("inflight_wait_timeouts_total", 1.0),
    // A (admitted at once) and B (timed out): each could wait.
    ("inflight_wait_duration_seconds_count{priority=\"0\"}", 2.0),
    ("inflight_store_up", 1.0),
];
const END: &[(&str, f64)] = &[
    ("inflight_admissions_total{result=\"admitted\"}", 2.0),
    ("inflight_admissions_total{result=\"rejected\"}", 1.0),
    ("inflight_admissions_total{result=\"error\"}", 0.0),
    ("inflight_releases_total", 2.0),
    ("inflight_in_flight", 0.0),
    ("inflight_waiting{class=\"default\",priority=\"0\"}", 0.0),
    ("inflight_tickets{class=\"default\"}", 0.0),
    ("inflight_wait_timeouts_total", 1.0),
    ("inflight_wait_duration_seconds_count{priority=\"0\"}", 3.0),
    ("inflight_store_up", 1.0),
];

fn check(command: &str, stage: &str, scrape: &Scrape, want: &[(&str, f64)]) {
    for (series, value) in want {
        assert_eq!(
            scrape.value(series),
            *value,
            "{command}, {stage}: {series}\n{}",
            scrape.0
        );
    }
}

/// The work through `serve`'s API on key app:1 (limit 1): A acquired; B waits and times out; C waits
/// and is admitted when A is released; C released. Returns the scrapes in the middle and at the end.
async fn through_serve(http: &Client, api: &str) -> (Scrape, Scrape) {
    let metrics = format!("{api}/metrics");
    let permits = format!("{api}/v1/keys/app:1/permits");
    let acquire = || {
        http.post(&permits)
            .json(&json!({ "wait_ms": WAIT_MS }))
            .send()
    };
    let a = acquire().await.unwrap();
    assert_eq!(a.status(), StatusCode::CREATED);
    let a: Value = a.json().await.unwrap();
    let b = acquire().await.unwrap();
    assert_eq!(b.status(), StatusCode::TOO_MANY_REQUESTS);
    let c = tokio::spawn({
        let (http, permits) = (http.clone(), permits.clone());
        async move {
            let answer = http.post(&permits).json(&json!({ "wait_ms": 10_000 }));
            answer.send().await.unwrap()
        }
    });
    let middle = until(
        http,
        &metrics,
        "inflight_waiting{class=\"default\",priority=\"0\"}",
        1.0,
    )
    .await;
    let released = http.delete(format!("{permits}/{}", a["id"].as_str().unwrap()));
    assert_eq!(
        released.send().await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    let c = c.await.unwrap();
    assert_eq!(c.status(), StatusCode::CREATED);
    let c: Value = c.json().await.unwrap();
    let released = http.delete(format!("{permits}/{}", c["id"].as_str().unwrap()));
    assert_eq!(
        released.send().await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    let end = until(http, &metrics, "inflight_releases_total", 2.0).await;
    (middle, end)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_and_proxy_count_the_same_work_the_same_way() {
    let http = Client::new();
    let (_serve, api) = serve("2", &[]);
    let (served_middle, served_end) = through_serve(&http, &api).await;
    check("serve", "middle", &served_middle, MIDDLE);
    check("serve", "end", &served_end, END);

    let upstream = Upstream::start().await;
    let (_proxy, proxied, admin) = proxy(&upstream, &[]);
    let (proxied_middle, proxied_end) = through_proxy(&http, &proxied, &admin, &upstream).await;
    check("proxy", "middle", &proxied_middle, MIDDLE);
    check("proxy", "end", &proxied_end, END);
    // And what only the proxy has: each request by status class, class of key and result.
    let proxied = |status: &str, result: &str| {
        let series = format!(
            "inflight_proxy_requests_total{{status_class=\"{status}\",class=\"default\",result=\"{result}\"}}"
        );
        proxied_end.value(&series)
    };
    assert_eq!(proxied("2xx", "admitted"), 2.0, "{}", proxied_end.0);
    assert_eq!(proxied("4xx", "refused"), 1.0, "{}", proxied_end.0);
    assert_eq!(
        proxied_end.value("inflight_upstream_duration_seconds_count"),
        2.0,
        "only the forwarded requests reached the upstream"
    );
    assert_eq!(upstream.hits(), 2);
}

/// A wait refused at once because its key's queue is full (`--max-waiters 1`) is a refusal, not a wait
/// that timed out: `inflight_wait_timeouts_total` counts only waits that ran their course.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_wait_queue_is_a_refusal_not_a_wait_timeout() {
    let http = Client::new();
    // One worker, so that every request meets the same queue.
    let (_server, api) = serve("1", &["--max-waiters", "1"]);
    let (metrics, permits) = (
        format!("{api}/metrics"),
        format!("{api}/v1/keys/app:1/permits"),
    );
    let acquire = |wait_ms: u64| {
        http.post(&permits)
            .json(&json!({ "wait_ms": wait_ms }))
            .send()
    };
    let held: Value = acquire(0).await.unwrap().json().await.unwrap();
    let waiter = tokio::spawn(acquire(10_000));
    until(
        &http,
        &metrics,
        "inflight_waiting{class=\"default\",priority=\"0\"}",
        1.0,
    )
    .await;
    let asked = Instant::now();
    let refused = acquire(10_000).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(asked.elapsed() < Duration::from_secs(5), "refused at once");
    let scrape = Scrape::of(&http, &metrics).await;
    check(
        "serve",
        "queue full",
        &scrape,
        &[
            ("inflight_admissions_total{result=\"rejected\"}", 1.0),
            ("inflight_wait_timeouts_total", 0.0),
        ],
    );
    let released = http.delete(format!("{permits}/{}", held["id"].as_str().unwrap()));
    assert_eq!(
        released.send().await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(waiter.await.unwrap().unwrap().status(), StatusCode::CREATED);
}

/// `inflight_store_up` follows the store: 1 with Redis up, 0 once it is stopped (and the admissions it
/// refuses meanwhile are `result="error"`), 1 again once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_up_follows_the_store() {
    let mut redis = common::TestRedis::start();
    let url = redis.url();
    let (_server, api) = serve("1", &["--store", &url]);
    let (http, metrics) = (Client::new(), format!("{api}/metrics"));
    until(&http, &metrics, "inflight_store_up", 1.0).await;
    redis.stop();
    until(&http, &metrics, "inflight_store_up", 0.0).await;
    let refused = http
        .post(format!("{api}/v1/keys/app:1/permits"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    let down = until(
        &http,
        &metrics,
        "inflight_admissions_total{result=\"error\"}",
        1.0,
    )
    .await;
    assert_eq!(down.value("inflight_store_up"), 0.0);
    redis.restart();
    until(&http, &metrics, "inflight_store_up", 1.0).await;
}
