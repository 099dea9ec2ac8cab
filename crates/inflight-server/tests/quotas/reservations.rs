//! Reservations committed or refunded once, and extended while their holder works.

use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

use crate::common::{get_text, limits, start_api, Make};
use crate::per_store;
use crate::{code, figures, send};

async fn reservations_are_committed_or_refunded_once<M: Make>() {
    let redis = M::redis();
    let server = start_api(&limits(1, 0), M::stores(&redis)).await;
    let http = Client::new();
    let base = server.base.clone();
    let set = json!({"balance": 5});
    assert_eq!(
        send(http.put(server.url("/v1/quotas/t1")).json(&set))
            .await
            .0,
        StatusCode::OK
    );
    let reservations = server.url("/v1/quotas/t1/reservations");

    let (status, spent) = send(http.post(&reservations).json(&json!({"amount": 2}))).await;
    assert_eq!(status, StatusCode::CREATED, "{spent}");
    assert_eq!(
        (spent["key"].as_str(), spent["amount"].as_u64()),
        (Some("t1"), Some(2))
    );
    assert_eq!(spent["balance"], 3);
    assert!(spent["expires_at_ms"].as_u64().unwrap() > 1_700_000_000_000);
    assert_eq!(figures(&http, &base, "t1").await, (json!(3), 2));
    let one = format!("{reservations}/{}", spent["id"].as_str().unwrap());
    let (status, body) = send(http.post(format!("{one}/commit"))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"key": "t1", "balance": 3, "reserved": 0}));
    let (status, _) = send(http.post(format!("{one}/commit"))).await;
    assert_eq!(status, StatusCode::OK, "a retried commit");
    let (status, body) = send(http.delete(&one)).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::NOT_FOUND, "reservation_not_found")
    );

    let (status, back) = send(http.post(&reservations)).await;
    assert_eq!(
        (status, back["amount"].as_u64()),
        (StatusCode::CREATED, Some(1)),
        "amount 1 by default"
    );
    let one = format!("{reservations}/{}", back["id"].as_str().unwrap());
    let (status, body) = send(http.delete(&one)).await;
    assert_eq!(
        (status, body["balance"].as_u64()),
        (StatusCode::OK, Some(3))
    );
    assert_eq!(
        send(http.delete(&one)).await.0,
        StatusCode::OK,
        "a retried refund"
    );
    let (status, body) = send(http.post(format!("{one}/commit"))).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::NOT_FOUND, "reservation_not_found")
    );
    let (status, body) = send(http.post(format!("{reservations}/never/commit"))).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::NOT_FOUND, "reservation_not_found")
    );

    let (status, body) = send(http.post(&reservations).json(&json!({"amount": 4}))).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::TOO_MANY_REQUESTS, "quota_exhausted")
    );
    assert_eq!(body["key"], "t1");
    for bad in [
        json!({"amount": 0}),
        json!({"ttl_ms": 0}),
        json!({"ttl_ms": 86_400_001}),
        json!({"id": "x"}),
    ] {
        let (status, body) = send(http.post(&reservations).json(&bad)).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{bad}"
        );
    }
    assert_eq!(figures(&http, &base, "t1").await, (json!(3), 0));

    // Not settled within its ttl: refunded by the store (on the next touch of the key).
    let (_, short) = send(http.post(&reservations).json(&json!({"ttl_ms": 100}))).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(figures(&http, &base, "t1").await, (json!(3), 0), "refunded");
    let late = format!("{reservations}/{}/commit", short["id"].as_str().unwrap());
    assert_eq!(send(http.post(late)).await.0, StatusCode::NOT_FOUND);

    // An unmetered key: nothing held, nothing to settle, nothing missing.
    let (status, free) = send(http.post(server.url("/v1/quotas/free/reservations"))).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        (free["balance"].clone(), free["expires_at_ms"].clone()),
        (Value::Null, Value::Null)
    );
    let commit = server.url(&format!(
        "/v1/quotas/free/reservations/{}/commit",
        free["id"].as_str().unwrap()
    ));
    let (status, body) = send(http.post(commit)).await;
    assert_eq!(
        (status, body["balance"].clone()),
        (StatusCode::OK, Value::Null)
    );

    let metrics = get_text(&http, server.url("/metrics")).await;
    for outcome in ["committed", "refunded", "expired"] {
        let line = format!("inflight_reservations_total{{outcome=\"{outcome}\"}}");
        assert!(metrics.contains(&line), "no {line} in\n{metrics}");
    }
}

/// A reservation held by a remote caller is extended with `PUT .../reservations/{id}`: its deadline
/// moves to its ttl from now, so work may outlast the ttl it was taken with; one settled or expired is
/// `404 reservation_not_found`, and bad input is `400`.
async fn a_reservation_is_extended_while_its_holder_works<M: Make>() {
    let redis = M::redis();
    let server = start_api(&limits(1, 0), M::stores(&redis)).await;
    let (http, base) = (Client::new(), server.base.clone());
    let set = json!({"balance": 5});
    send(http.put(server.url("/v1/quotas/t1")).json(&set)).await;
    let reservations = server.url("/v1/quotas/t1/reservations");
    let short = json!({"ttl_ms": 500});
    let (status, held) = send(http.post(&reservations).json(&short)).await;
    assert_eq!(status, StatusCode::CREATED, "{held}");
    let one = format!("{reservations}/{}", held["id"].as_str().unwrap());
    let mut deadline = held["expires_at_ms"].as_u64().unwrap();
    // Over two ttls of work, extended every 100 ms (by 500 ms, then by the default ttl).
    for n in 0..13 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let request = if n < 12 {
            http.put(&one).json(&short)
        } else {
            http.put(&one)
        };
        let (status, body) = send(request).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            (body["key"].as_str(), body["reserved"].as_u64()),
            (Some("t1"), Some(1))
        );
        let moved = body["expires_at_ms"].as_u64().unwrap();
        assert!(moved > deadline, "{body}");
        deadline = moved;
    }
    assert!(
        deadline > held["expires_at_ms"].as_u64().unwrap() + 60_000,
        "the default ttl is the server's --quota-ttl (1 h)"
    );
    assert_eq!(
        figures(&http, &base, "t1").await,
        (json!(4), 1),
        "still held"
    );
    for bad in [
        json!({"ttl_ms": 0}),
        json!({"ttl_ms": 86_400_001}),
        json!({"amount": 1}),
    ] {
        let (status, body) = send(http.put(&one).json(&bad)).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{bad}"
        );
    }
    let (status, _) = send(http.post(format!("{one}/commit"))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        figures(&http, &base, "t1").await,
        (json!(4), 0),
        "committed"
    );
    // Settled, never made: nothing to extend.
    for gone in [one.clone(), format!("{reservations}/never")] {
        let (status, body) = send(http.put(&gone)).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::NOT_FOUND, "reservation_not_found"),
            "{gone}"
        );
    }
    // Expired: refunded, and not extended after.
    let (_, left) = send(http.post(&reservations).json(&json!({"ttl_ms": 100}))).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let late = format!("{reservations}/{}", left["id"].as_str().unwrap());
    assert_eq!(send(http.put(&late)).await.0, StatusCode::NOT_FOUND);
    assert_eq!(figures(&http, &base, "t1").await, (json!(4), 0), "refunded");
    // An unmetered key holds nothing: nothing to extend, nothing missing.
    let (status, body) = send(http.put(server.url("/v1/quotas/free/reservations/any"))).await;
    assert_eq!(
        (status, body["balance"].clone()),
        (StatusCode::OK, Value::Null)
    );
}

per_store!(
    reservations_are_committed_or_refunded_once,
    a_reservation_is_extended_while_its_holder_works,
);
