//! Fundings over HTTP apply once per `Idempotency-Key`: the same request again is answered as the first
//! time and changes nothing, another key applies again, and a key used for another request is 422.

use reqwest::{Client, StatusCode};
use serde_json::json;

use crate::common::{limits, start_api, Make};
use crate::per_store;
use crate::{code, figures, send};

async fn a_top_up_applies_once_per_idempotency_key<M: Make>() {
    let redis = M::redis();
    let server = start_api(&limits(1, 0), M::stores(&redis)).await;
    let http = Client::new();
    let url = server.url("/v1/quotas/tenant:t1");
    let top_up = format!("{url}/top-up");
    let (status, _) = send(http.put(&url).json(&json!({"balance": 100}))).await;
    assert_eq!(status, StatusCode::OK);

    // The same top-up twice under one key (a client's retry): credited once, answered alike.
    let once = |key: &str, amount: u64| {
        http.post(&top_up)
            .header("Idempotency-Key", key)
            .json(&json!({"amount": amount}))
    };
    for replayed in [None, Some("true")] {
        let response = once("\"payment-1\"", 50).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let header = response.headers().get("idempotent-replayed");
        assert_eq!(header.map(|v| v.to_str().unwrap()), replayed);
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(
            body,
            json!({"key": "tenant:t1", "balance": 150, "reserved": 0})
        );
    }
    // The bare form is the same key as the quoted one.
    let (status, body) = send(once("payment-1", 50)).await;
    assert_eq!(
        (status, body["balance"].as_u64()),
        (StatusCode::OK, Some(150))
    );
    assert_eq!(
        figures(&http, &server.base, "tenant:t1").await,
        (json!(150), 0)
    );

    // Another key, or none: credited again.
    let (status, body) = send(once("payment-2", 50)).await;
    assert_eq!(
        (status, body["balance"].as_u64()),
        (StatusCode::OK, Some(200))
    );
    let (status, body) = send(http.post(&top_up).json(&json!({"amount": 50}))).await;
    assert_eq!(
        (status, body["balance"].as_u64()),
        (StatusCode::OK, Some(250))
    );

    // A key used for another request: 422, nothing changed.
    let (status, body) = send(once("payment-1", 60)).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reused")
    );
    let set_again = http
        .put(&url)
        .header("Idempotency-Key", "payment-1")
        .json(&json!({"balance": 50}));
    let (status, _) = send(set_again).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);

    // A set under a key, retried after a top-up made meanwhile, does not undo the top-up.
    let set = || {
        http.put(&url)
            .header("Idempotency-Key", "set-1")
            .json(&json!({"balance": 10}))
    };
    assert_eq!(send(set()).await.1["balance"], json!(10));
    send(http.post(&top_up).json(&json!({"amount": 1}))).await;
    assert_eq!(
        send(set()).await.1["balance"],
        json!(10),
        "as answered first"
    );
    assert_eq!(
        figures(&http, &server.base, "tenant:t1").await,
        (json!(11), 0)
    );

    // Keys that are not one: empty, too long, not visible ASCII, a broken quote, two headers.
    let long = "k".repeat(257);
    for bad in ["\"\"", long.as_str(), "a b", "\"open", "\"a\"b", "\"a\\b\""] {
        let (status, body) = send(once(bad, 1)).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{bad:?}"
        );
    }
    let twice = once("a", 1).header("Idempotency-Key", "b");
    assert_eq!(send(twice).await.0, StatusCode::BAD_REQUEST);
    assert_eq!(
        figures(&http, &server.base, "tenant:t1").await,
        (json!(11), 0)
    );
}

per_store!(a_top_up_applies_once_per_idempotency_key,);
