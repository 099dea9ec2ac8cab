//! Every error code: bad input never gets a 500, and a store that is down gets a 503.

use std::time::Duration;

use inflight_server::config::Layered;
use reqwest::{Client, StatusCode};
use serde_json::json;

use crate::common;
use crate::common::{get_text, limits, start_api, status_of, Make, TestRedis};
use crate::per_store;
use crate::{assert_error, body};

async fn bad_input_gets_a_clear_error_and_never_a_500<M: Make>() {
    let redis = M::redis();
    let server = start_api(&limits(2, 0), M::stores(&redis)).await;
    let http = Client::new();
    let long = "k".repeat(257);
    for path in [
        "/v1/keys//permits",
        "/v1/keys/a%01b/permits",
        &format!("/v1/keys/{long}/permits"),
        "/v1/keys/%FF/permits",
    ] {
        assert_error(
            http.post(server.url(path)).send().await.unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_key",
        )
        .await;
    }
    let url = server.url("/v1/keys/app/permits");
    for bad in [
        "{bad",
        "[]",
        "{\"weight\": 0}",
        "{\"weight\": -1}",
        "{\"lease_ms\": 0}",
        "{\"lease_ms\": 99999999999}",
        "{\"id\": \"\"}",
        "{\"unknown\": 1}",
        "{\"id\": 5}",
    ] {
        let response = http.post(&url).body(bad).send().await.unwrap();
        assert_error(response, StatusCode::BAD_REQUEST, "invalid_request").await;
    }
    let heavy = http
        .post(&url)
        .json(&json!({"weight": 3}))
        .send()
        .await
        .unwrap();
    assert_error(heavy, StatusCode::BAD_REQUEST, "weight_exceeds_limit").await;
    // Issue 28: a lease shorter than its renewal can serve is refused, naming the minimum (100 ms).
    for short in [1, 99] {
        let refused = http.post(&url).json(&json!({"lease_ms": short}));
        let refused = body(refused.send().await.unwrap()).await;
        assert_eq!(refused["code"], "invalid_request", "{refused}");
        assert!(
            refused["message"].as_str().unwrap().contains("100 and"),
            "{refused}"
        );
    }
    let at_least = http.post(&url).json(&json!({"lease_ms": 100}));
    let at_least = at_least.send().await.unwrap();
    assert_eq!(at_least.status(), StatusCode::CREATED);
    let id = body(at_least).await["id"].as_str().unwrap().to_owned();
    let released = http.delete(format!("{url}/{id}")).send().await.unwrap();
    assert_eq!(released.status(), StatusCode::NO_CONTENT);
    let limit = http
        .put(server.url("/v1/keys/app/limit"))
        .body("{\"limit\": \"x\"}")
        .send()
        .await
        .unwrap();
    assert_error(limit, StatusCode::BAD_REQUEST, "invalid_request").await;
    let limit = http
        .put(server.url("/v1/keys/app/limit"))
        .send()
        .await
        .unwrap();
    assert_error(limit, StatusCode::BAD_REQUEST, "invalid_request").await;
    // An override no process could read (past 2^32 - 1) is refused, naming the largest.
    let limit = http.put(server.url("/v1/keys/app/limit"));
    let limit = body(limit.body("{\"limit\": 4294967296}").send().await.unwrap()).await;
    assert_eq!(limit["code"], "invalid_request", "{limit}");
    assert!(
        limit["message"].as_str().unwrap().contains("4294967295"),
        "{limit}"
    );
    assert_error(
        http.get(server.url("/nope")).send().await.unwrap(),
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    assert_error(
        http.patch(url.clone()).send().await.unwrap(),
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
    )
    .await;
    // Odd bytes everywhere: any 4xx, never a 5xx.
    for body in [
        "",
        "null",
        "{}",
        "{\"id\": \"\\u0000\"}",
        "\u{feff}{}",
        "{\"weight\": 1e99}",
    ] {
        let status = status_of(http.post(&url).body(body)).await;
        assert!(
            status.is_success() || status.is_client_error(),
            "{body:?} -> {status}"
        );
    }
    // Nothing bad was admitted.
    assert!(body_in_flight(&http, &server.url("/v1/keys/app")).await <= 2);
}

async fn body_in_flight(http: &Client, url: &str) -> u64 {
    body(http.get(url).send().await.unwrap()).await["in_flight"]
        .as_u64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_means_503_store_unavailable_under_fail_closed_and_not_ready() {
    let mut redis = TestRedis::start();
    let server = start_api(&limits(1, 0), common::redis_stores(&redis)).await;
    let http = Client::new();
    redis.stop();
    assert_error(
        http.post(server.url("/v1/keys/a/permits"))
            .send()
            .await
            .unwrap(),
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
    )
    .await;
    assert_error(
        http.get(server.url("/v1/keys/a")).send().await.unwrap(),
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
    )
    .await;
    assert_error(
        http.get(server.url("/readyz")).send().await.unwrap(),
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
    )
    .await;
    let metrics = get_text(&http, server.url("/metrics")).await;
    assert!(metrics.contains("inflight_admissions_total{result=\"error\"}"));
    redis.restart();
    let mut ready = false;
    for _ in 0..100 {
        if status_of(http.get(server.url("/readyz"))).await == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ready, "ready again once Redis is back");
    // Admissions skip the store for a moment after a failure, then try it again by themselves.
    let back = std::time::Instant::now();
    while status_of(http.post(server.url("/v1/keys/a/permits"))).await != 201 {
        assert!(
            back.elapsed() < Duration::from_secs(1),
            "admissions did not resume within 1 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

per_store!(
    bad_input_gets_a_clear_error_and_never_a_500,
    a_refusal_names_the_refusing_limit,
    an_admission_that_queued_names_the_limit_it_waited_on,
);

/// A refusal names the limit that refused it: the key, its class and, over the limit, the limit and the
/// count in flight, in the body and in the `Inflight-Limit` header; for one key and for several.
async fn a_refusal_names_the_refusing_limit<M: Make>() {
    let redis = M::redis();
    let flags = ["inflight", "--default-limit", "5", "--limit", "app:*=1"];
    let mut settings = inflight_server::Settings::from_flags(flags).unwrap();
    settings.workers = Some(2);
    let server = start_api(&settings, M::stores(&redis)).await;
    let http = Client::new();
    let url = server.url("/v1/keys/app:a1/permits");
    assert_eq!(status_of(http.post(&url)).await, StatusCode::CREATED);
    let named = r#"key="app:a1"; class="app:*"; limit=1; in_flight=1"#;
    let full = http.post(&url).send().await.unwrap();
    assert_eq!(full.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(full.headers()["inflight-limit"], named);
    let full = body(full).await;
    assert_eq!(
        (
            &full["key"],
            &full["class"],
            &full["limit"],
            &full["in_flight"]
        ),
        (&json!("app:a1"), &json!("app:*"), &json!(1), &json!(1))
    );
    // Several keys: the one that refused is named, with its class.
    let several = json!({"keys": ["tenant:t1", "app:a1"]});
    let full = http
        .post(server.url("/v1/permits"))
        .json(&several)
        .send()
        .await
        .unwrap();
    assert_eq!(full.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(full.headers()["inflight-limit"], named);
    assert_eq!(body(full).await["class"], "app:*");
    // A key of no rule's class is of the default class.
    let default = server.url("/v1/keys/other/permits");
    for _ in 0..5 {
        assert_eq!(status_of(http.post(&default)).await, StatusCode::CREATED);
    }
    let full = http.post(&default).send().await.unwrap();
    assert_eq!(
        full.headers()["inflight-limit"],
        r#"key="other"; class="default"; limit=5; in_flight=5"#
    );
}

/// An admission that waited in a key's queue names that key in `Inflight-Limit`, with its figures at
/// admission; one that did not wait carries no such header.
async fn an_admission_that_queued_names_the_limit_it_waited_on<M: Make>() {
    let redis = M::redis();
    let flags = ["inflight", "--limit", "app:*=1"];
    let settings = inflight_server::Settings::from_flags(flags).unwrap();
    let server = start_api(&settings, M::stores(&redis)).await;
    let http = Client::new();
    let url = server.url("/v1/keys/app:a1/permits");
    let first = http.post(&url).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(
        first.headers().get("inflight-limit").is_none(),
        "admitted at once"
    );
    let id = body(first).await["id"].as_str().unwrap().to_owned();
    let waiter = {
        let (http, url) = (http.clone(), url.clone());
        tokio::spawn(async move {
            http.post(&url)
                .json(&json!({"wait_ms": 30000}))
                .send()
                .await
        })
    };
    // Released once the waiter is queued (listed as waiting), so that it is admitted after queueing.
    let waiting = server.url("/v1/keys/app:a1/permits");
    for _ in 0..2000 {
        if body(http.get(&waiting).send().await.unwrap()).await["waiters"]
            .as_array()
            .is_some_and(|w| !w.is_empty())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let released = http.delete(format!("{url}/{id}")).send().await.unwrap();
    assert_eq!(released.status(), StatusCode::NO_CONTENT);
    let admitted = waiter.await.unwrap().unwrap();
    assert_eq!(admitted.status(), StatusCode::CREATED);
    assert_eq!(
        admitted.headers()["inflight-limit"],
        r#"key="app:a1"; class="app:*"; limit=1; in_flight=1"#
    );
}
