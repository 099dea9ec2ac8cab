//! Limits set and cleared, and the admin token that guards them.

use inflight_server::Settings;
use reqwest::{Client, StatusCode};
use serde_json::json;

use crate::common::{limits, start_api, status_of, Make};
use crate::per_store;
use crate::{assert_error, body};

async fn limits_are_set_and_cleared<M: Make>() {
    let redis = M::redis();
    let server = start_api(&limits(1, 10), M::stores(&redis)).await;
    let http = Client::new();
    let set = http
        .put(server.url("/v1/keys/tenant%2F7/limit"))
        .json(&json!({"limit": 50}))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), StatusCode::OK);
    assert_eq!(
        body(set).await,
        json!({"key": "tenant/7", "limit": 10, "in_flight": 0}),
        "capped by the ceiling"
    );
    let set = http
        .put(server.url("/v1/keys/tenant%2F7/limit"))
        .json(&json!({"limit": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(body(set).await["limit"], 3);
    for _ in 0..3 {
        assert_eq!(
            status_of(http.post(server.url("/v1/keys/tenant%2F7/permits"))).await,
            201
        );
    }
    assert_eq!(
        status_of(http.post(server.url("/v1/keys/tenant%2F7/permits"))).await,
        429
    );
    let cleared = http
        .delete(server.url("/v1/keys/tenant%2F7/limit"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        body(cleared).await,
        json!({"key": "tenant/7", "limit": 1, "in_flight": 3})
    );
    let zero = http
        .put(server.url("/v1/keys/tenant%2F7/limit"))
        .json(&json!({"limit": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(body(zero).await["limit"], 1, "0 clears");
}

async fn the_admin_token_guards_limit_changes<M: Make>() {
    let redis = M::redis();
    let args = Settings {
        admin_token: Some("s3cret".into()),
        ..limits(1, 0)
    };
    let server = start_api(&args, M::stores(&redis)).await;
    let http = Client::new();
    let url = server.url("/v1/keys/app/limit");
    assert_error(
        http.put(&url)
            .json(&json!({"limit": 5}))
            .send()
            .await
            .unwrap(),
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    )
    .await;
    let wrong = http
        .put(&url)
        .bearer_auth("guess")
        .json(&json!({"limit": 5}))
        .send()
        .await
        .unwrap();
    assert_error(wrong, StatusCode::UNAUTHORIZED, "unauthorized").await;
    assert_error(
        http.delete(&url).send().await.unwrap(),
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    )
    .await;
    let right = http
        .put(&url)
        .bearer_auth("s3cret")
        .json(&json!({"limit": 5}))
        .send()
        .await
        .unwrap();
    assert_eq!(right.status(), StatusCode::OK);
    // The scheme in any case (RFC 9110), with any spaces after it.
    for authorization in ["bearer s3cret", "BEARER   s3cret", "Bearer\ts3cret"] {
        let lower = http
            .put(&url)
            .header("authorization", authorization)
            .json(&json!({"limit": 5}))
            .send()
            .await
            .unwrap();
        assert_eq!(lower.status(), StatusCode::OK, "{authorization}");
    }
    for wrong in ["Basic s3cret", "s3cret", "Bearer s3cret2", "Bearers3cret"] {
        let refused = http
            .put(&url)
            .header("authorization", wrong)
            .json(&json!({"limit": 5}))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED, "{wrong}");
    }
    // Acquiring needs no token.
    assert_eq!(
        status_of(http.post(server.url("/v1/keys/app/permits"))).await,
        201
    );
}

per_store!(
    limits_are_set_and_cleared,
    the_admin_token_guards_limit_changes,
);
