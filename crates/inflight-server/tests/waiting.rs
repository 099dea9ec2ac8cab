//! Waiting for a slot over HTTP: `wait_ms` in the acquire bodies, and the proxy's `--max-wait`, with a
//! client that goes away while it waits. Two workers per server: a release in one wakes a waiter in the
//! other (through the store).
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::{limits, metric, proxy_settings, start_api, start_proxy, Make, Memory, Upstream};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

async fn wait_ms_waits_for_a_release_and_times_out<M: Make>() {
    let redis = M::redis();
    let server = start_api(&limits(1, 0), M::stores(&redis)).await;
    let http = Client::new();
    let permits = server.url("/v1/keys/model/permits");
    let held: Value = http
        .post(&permits)
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // Waits, holding nothing, until the first is released (maybe through the other worker).
    let waiter = {
        let (http, permits) = (http.clone(), permits.clone());
        tokio::spawn(async move {
            let answer = http.post(&permits).json(&json!({"wait_ms": 10_000})).send();
            answer.await.unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let status: Value = http
        .get(server.url("/v1/keys/model"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status["in_flight"], 1, "the waiter holds nothing");
    let id = held["id"].as_str().unwrap();
    let released = http.delete(format!("{permits}/{id}")).send().await.unwrap();
    assert_eq!(released.status(), StatusCode::NO_CONTENT);
    let admitted = waiter.await.unwrap();
    assert_eq!(admitted.status(), StatusCode::CREATED);
    // Held now: a short wait ends in the refusal an immediate admission gets.
    let refused = http
        .post(&permits)
        .json(&json!({"wait_ms": 100}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "too_many_requests");
    // Several keys wait alike; a wait past the bound is refused as invalid.
    let all = http
        .post(server.url("/v1/permits"))
        .json(&json!({"keys": ["model", "tenant"], "wait_ms": 100}))
        .send()
        .await
        .unwrap();
    assert_eq!(all.status(), StatusCode::TOO_MANY_REQUESTS);
    let too_long = http
        .post(&permits)
        .json(&json!({"wait_ms": 300_001}))
        .send()
        .await
        .unwrap();
    assert_eq!(too_long.status(), StatusCode::BAD_REQUEST);
}

/// `"priority"` and `"flow"` beside `wait_ms`: checked (a level is 0 to 255, a flow at most 256 bytes)
/// and taken.
async fn priority_and_flow_are_checked_and_taken<M: Make>() {
    let redis = M::redis();
    let server = start_api(&limits(1, 0), M::stores(&redis)).await;
    let http = Client::new();
    let permits = server.url("/v1/keys/model/permits");
    for bad in [
        json!({"wait_ms": 100, "priority": 256}),
        json!({"wait_ms": 100, "priority": -1}),
        json!({"wait_ms": 100, "flow": "f".repeat(257)}),
        json!({"wait_ms": 100, "flow": "f", "flow_weight": 0}),
        json!({"wait_ms": 100, "flow": "f", "flow_weight": 1001}),
        json!({"keys": ["model"], "flow": "f".repeat(257)}),
    ] {
        let url = match bad.get("keys") {
            Some(_) => server.url("/v1/permits"),
            None => permits.clone(),
        };
        let refused = http.post(&url).json(&bad).send().await.unwrap();
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST, "{bad}");
    }
    let taken = json!({"wait_ms": 100, "priority": 3, "flow": "acme", "flow_weight": 3});
    let admitted = http.post(&permits).json(&taken).send().await.unwrap();
    assert_eq!(admitted.status(), StatusCode::CREATED);

    // With --priorities, only those levels.
    let settings = inflight_server::Settings {
        priorities: vec![0, 5],
        ..limits(1, 0)
    };
    let server = start_api(&settings, M::stores(&redis)).await;
    let permits = server.url("/v1/keys/levels/permits");
    let outside = json!({"wait_ms": 100, "priority": 3});
    let refused = http.post(&permits).json(&outside).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "invalid_priority");
    let inside = json!({"wait_ms": 100, "priority": 5});
    let admitted = http.post(&permits).json(&inside).send().await.unwrap();
    assert_eq!(admitted.status(), StatusCode::CREATED);
}

per_store!(
    wait_ms_waits_for_a_release_and_times_out,
    priority_and_flow_are_checked_and_taken
);

/// Over HTTP, across the server's two workers (each its own store handle, as processes are): a waiter
/// of a higher `"priority"` passes those queued before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_priority_passes_the_queue_on_redis() {
    let redis = common::Redis::redis();
    let server = start_api(&limits(1, 0), common::Redis::stores(&redis)).await;
    let http = Client::new();
    let permits = server.url("/v1/keys/model/permits");
    let held: Value = http
        .post(&permits)
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let queued = || {
        let mut c = redis.as_ref().unwrap().client();
        ::redis::cmd("ZCARD")
            .arg("inflight:{model}:queue")
            .query::<usize>(&mut c)
            .unwrap()
    };
    let mut waiters = Vec::new();
    for (n, priority) in [0, 0, 7].into_iter().enumerate() {
        let (http, permits) = (http.clone(), permits.clone());
        let body = json!({"wait_ms": 30_000, "priority": priority, "id": format!("w{n}"), "lease_ms": 100});
        waiters.push(tokio::spawn(async move {
            let answer = http.post(&permits).json(&body).send().await.unwrap();
            assert_eq!(answer.status(), StatusCode::CREATED);
            let permit: Value = answer.json().await.unwrap();
            let id = permit["id"].as_str().unwrap().to_owned();
            let released = http.delete(format!("{permits}/{id}")).send().await.unwrap();
            assert_eq!(released.status(), StatusCode::NO_CONTENT);
            (std::time::Instant::now(), id)
        }));
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while queued() != n + 1 {
            assert!(std::time::Instant::now() < deadline, "ticket {n} queued");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let id = held["id"].as_str().unwrap();
    http.delete(format!("{permits}/{id}")).send().await.unwrap();
    let mut admitted = Vec::new();
    for waiter in waiters {
        admitted.push(waiter.await.unwrap());
    }
    admitted.sort();
    let order: Vec<&str> = admitted.iter().map(|(_, id)| id.as_str()).collect();
    assert_eq!(order, ["w2", "w0", "w1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_waits_up_to_max_wait_and_a_client_that_leaves_leaves_the_queue() {
    let upstream = Upstream::start().await;
    let mut settings = proxy_settings(&upstream.base, limits(1, 0));
    settings.max_wait = Duration::from_secs(10);
    let server = start_proxy(&settings, Memory::stores(&None)).await;
    let http = Client::new();
    let get = |timeout: Duration| {
        http.get(server.url("/sse"))
            .header("x-inflight-key", "proxied-model")
            .timeout(timeout)
            .send()
    };
    // The first holds the slot while its stream runs (the upstream sends one event, then waits).
    let mut first = get(Duration::from_secs(10)).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert!(first.chunk().await.unwrap().is_some());
    let metrics = server.url("/_inflight/metrics");
    let waiting = r#"inflight_waiting{class="default",priority="0"}"#;
    // One gives up while waiting: it leaves the queue at once.
    assert!(get(Duration::from_millis(300)).await.is_err());
    for _ in 0..100 {
        if metric(&http, &metrics, waiting).await == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(metric(&http, &metrics, waiting).await, 0.0);
    // Another waits, and is let in when the first stream ends.
    let second = tokio::spawn(get(Duration::from_secs(10)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(metric(&http, &metrics, waiting).await, 1.0);
    upstream.gate.add_permits(2);
    while first.chunk().await.unwrap().is_some() {}
    let second = second.await.unwrap().unwrap();
    assert_eq!(second.status(), StatusCode::OK);
    assert_eq!(
        upstream.hits(),
        2,
        "the one that left never reached the upstream"
    );
}
