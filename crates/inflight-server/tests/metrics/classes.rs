//! The series by class of key: a fresh server's help and zeros of the new ones, and
//! `inflight_tickets` of a class rising while a request waits on a full key of it, falling after, on
//! the memory store and on Redis.

use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

use crate::common;
use crate::{serve, until, Scrape};

/// The metrics by class that a fresh server describes and exports at 0 (class `default`).
const FROM_START: &[(&str, &str)] = &[
    ("inflight_tickets", "inflight_tickets{class=\"default\"}"),
    (
        "inflight_revocations_total",
        "inflight_revocations_total{class=\"default\",kind=\"holder\"}",
    ),
    (
        "inflight_revocations_total",
        "inflight_revocations_total{class=\"default\",kind=\"waiter\"}",
    ),
    (
        "inflight_shadow_refusals_total",
        "inflight_shadow_refusals_total{class=\"default\"}",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_server_describes_the_series_by_class_and_exports_them_at_zero() {
    let http = Client::new();
    let (_server, api) = serve("1", &[]);
    let fresh = Scrape::of(&http, &format!("{api}/metrics")).await;
    for &(name, series) in FROM_START {
        assert!(
            fresh.0.contains(&format!("# HELP {name} ")),
            "{name} has no # HELP:\n{}",
            fresh.0
        );
        assert_eq!(fresh.sample(series), Some(0.0), "{series}:\n{}", fresh.0);
    }
    for (name, kind) in [
        ("inflight_tickets", "gauge"),
        ("inflight_revocations_total", "counter"),
        ("inflight_shadow_refusals_total", "counter"),
    ] {
        assert!(
            fresh.0.contains(&format!("# TYPE {name} {kind}\n")),
            "{name} is a {kind}:\n{}",
            fresh.0
        );
    }
}

/// On a server with `store` settings and a class `app:*` of limit 1: a permit of app:1 held, a second
/// request waits on app:1, then is admitted when the first is released. Its ticket counts under its
/// class (never under its key), while it waits only.
async fn tickets_follow_a_wait(store: &[&str]) {
    let http = Client::new();
    let mut extra = vec!["--limit", "app:*=1"];
    extra.extend_from_slice(store);
    // One worker, so that every request meets the same queue.
    let (_server, api) = serve("1", &extra);
    let (metrics, permits) = (
        format!("{api}/metrics"),
        format!("{api}/v1/keys/app:1/permits"),
    );
    let tickets = "inflight_tickets{class=\"app:*\"}";
    let acquire = |wait_ms: u64| {
        http.post(&permits)
            .json(&json!({ "wait_ms": wait_ms }))
            .send()
    };
    let held = acquire(0).await.unwrap();
    assert_eq!(held.status(), StatusCode::CREATED);
    let held: Value = held.json().await.unwrap();
    assert_eq!(Scrape::of(&http, &metrics).await.value(tickets), 0.0);

    let waiter = tokio::spawn(acquire(10_000));
    let waiting = until(&http, &metrics, tickets, 1.0).await;
    for (series, want) in [
        ("inflight_waiting{class=\"app:*\",priority=\"0\"}", 1.0),
        ("inflight_tickets{class=\"default\"}", 0.0),
    ] {
        assert_eq!(waiting.value(series), want, "{series}:\n{}", waiting.0);
    }
    assert!(!waiting.0.contains("app:1"), "no key in the labels");

    let released = http.delete(format!("{permits}/{}", held["id"].as_str().unwrap()));
    assert_eq!(
        released.send().await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    let admitted = waiter.await.unwrap().unwrap();
    assert_eq!(admitted.status(), StatusCode::CREATED);
    let after = until(&http, &metrics, tickets, 0.0).await;
    assert_eq!(
        after.value("inflight_waiting{class=\"app:*\",priority=\"0\"}"),
        0.0,
        "{}",
        after.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tickets_of_a_class_follow_a_wait_on_the_memory_store() {
    tickets_follow_a_wait(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tickets_of_a_class_follow_a_wait_on_redis() {
    let redis = common::TestRedis::start();
    let url = redis.url();
    tickets_follow_a_wait(&["--store", &url]).await;
}
