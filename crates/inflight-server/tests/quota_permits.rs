//! Charges taken with permits over HTTP (`"quota"` in an acquire body), settled when the permits are
//! released, against a real client, on the memory and the Redis store.
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::{get_json, limits, start_api, Make};
use inflight_server::config::QuotaCommit;
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

async fn send(request: reqwest::RequestBuilder) -> (StatusCode, Value) {
    let response = request.send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// (balance, reserved) as `GET /v1/quotas/{key}` answers them.
async fn figures(http: &Client, base: &str, key: &str) -> (Value, u64) {
    let body = get_json(http, format!("{base}/v1/quotas/{key}")).await;
    assert_eq!(body["key"], key);
    (body["balance"].clone(), body["reserved"].as_u64().unwrap())
}

fn code(body: &Value) -> &str {
    body["code"].as_str().unwrap_or_default()
}

async fn a_permit_with_a_quota_settles_when_released<M: Make>() {
    let redis = M::redis();
    let server = start_api(&limits(1, 0), M::stores(&redis)).await;
    let (http, base) = (Client::new(), server.base.clone());
    let set = json!({"balance": 3});
    send(http.put(server.url("/v1/quotas/tenant:t1")).json(&set)).await;
    let permits = server.url("/v1/keys/app:a1/permits");
    let charged = json!({"quota": {"key": "tenant:t1", "amount": 1}});

    let (status, permit) = send(http.post(&permits).json(&charged)).await;
    assert_eq!(status, StatusCode::CREATED, "{permit}");
    let reservation = &permit["reservation"];
    assert_eq!(
        reservation["id"], permit["id"],
        "reserved under the permit's id"
    );
    assert_eq!(
        (reservation["key"].as_str(), reservation["balance"].as_u64()),
        (Some("tenant:t1"), Some(2))
    );
    assert_eq!(figures(&http, &base, "tenant:t1").await, (json!(2), 1));
    // The key is full: refused, and the charge is back before the answer.
    let (status, body) = send(http.post(&permits).json(&charged)).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::TOO_MANY_REQUESTS, "too_many_requests")
    );
    assert_eq!(figures(&http, &base, "tenant:t1").await, (json!(2), 1));
    let one = format!("{permits}/{}", permit["id"].as_str().unwrap());
    let (status, body) = send(http.delete(format!("{one}?outcome=bogus"))).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::BAD_REQUEST, "invalid_request")
    );
    assert_eq!(
        http.delete(format!("{one}?outcome=success"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        figures(&http, &base, "tenant:t1").await,
        (json!(2), 0),
        "committed"
    );
    assert_eq!(server.in_flight("app:a1").await, 0);

    // Released without an outcome, or with a failure: refunded.
    for outcome in ["", "?outcome=failure"] {
        let (status, permit) = send(http.post(&permits).json(&charged)).await;
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(figures(&http, &base, "tenant:t1").await, (json!(1), 1));
        let one = format!("{permits}/{}{outcome}", permit["id"].as_str().unwrap());
        assert_eq!(
            http.delete(one).send().await.unwrap().status(),
            StatusCode::NO_CONTENT
        );
        assert_eq!(
            figures(&http, &base, "tenant:t1").await,
            (json!(2), 0),
            "{outcome:?}"
        );
    }

    // A given id is the reservation's too; reused a moment after its settlement, it is refused.
    let given = json!({"id": "req-9", "quota": {"key": "tenant:t1"}});
    let (status, permit) = send(http.post(&permits).json(&given)).await;
    assert_eq!(
        (status, permit["reservation"]["id"].as_str()),
        (StatusCode::CREATED, Some("req-9"))
    );
    http.delete(format!("{permits}/req-9?outcome=success"))
        .send()
        .await
        .unwrap();
    let (status, body) = send(http.post(&permits).json(&given)).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::CONFLICT, "reservation_settled")
    );

    // Exhausted: refused as such, and no admission was tried.
    assert_eq!(figures(&http, &base, "tenant:t1").await, (json!(1), 0));
    let (status, body) = send(
        http.post(&permits)
            .json(&json!({"quota": {"key": "tenant:t1", "amount": 2}})),
    )
    .await;
    assert_eq!(
        (status, code(&body), body["key"].as_str()),
        (
            StatusCode::TOO_MANY_REQUESTS,
            "quota_exhausted",
            Some("tenant:t1")
        )
    );
    assert_eq!(server.in_flight("app:a1").await, 0);
    for (bad, why) in [
        (json!({"quota": {"key": ""}}), "invalid_key"),
        (
            json!({"quota": {"key": "t", "amount": 0}}),
            "invalid_request",
        ),
        (
            json!({"quota": {"key": "t", "weight": 1}}),
            "invalid_request",
        ),
    ] {
        let (status, body) = send(http.post(&permits).json(&bad)).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::BAD_REQUEST, why),
            "{bad}"
        );
    }
    // An unmetered key: the permit is granted and its reservation holds nothing.
    let (status, permit) = send(http.post(&permits).json(&json!({"quota": {"key": "free"}}))).await;
    assert_eq!(
        (status, permit["reservation"]["balance"].clone()),
        (StatusCode::CREATED, Value::Null)
    );
}

async fn a_permit_on_several_keys_settles_through_any_server<M: Make>() {
    let redis = M::redis();
    let stores = M::stores(&redis);
    let (one, other) = (
        start_api(&limits(1, 0), stores.clone()).await,
        start_api(&limits(1, 0), stores).await,
    );
    let (http, base) = (Client::new(), one.base.clone());
    send(
        http.put(one.url("/v1/quotas/tenant:t1"))
            .json(&json!({"balance": 5})),
    )
    .await;
    let body = json!({"keys": ["app:a1", "global"], "quota": {"key": "tenant:t1", "amount": 2}});
    let (status, permit) = send(http.post(one.url("/v1/permits")).json(&body)).await;
    assert_eq!(status, StatusCode::CREATED, "{permit}");
    assert_eq!(permit["reservation"]["balance"], 3);
    let (status, refused) = send(http.post(one.url("/v1/permits")).json(&body)).await;
    assert_eq!(
        (status, refused["key"].as_str()),
        (StatusCode::TOO_MANY_REQUESTS, Some("app:a1"))
    );
    assert_eq!(
        figures(&http, &base, "tenant:t1").await,
        (json!(3), 2),
        "the refusal refunded"
    );
    // Renewed and released through the other server, by id alone: the charge is committed.
    let by_id = other.url(&format!("/v1/permits/{}", permit["id"].as_str().unwrap()));
    assert_eq!(
        http.put(&by_id).send().await.unwrap().status(),
        StatusCode::OK
    );
    let released = http
        .delete(format!("{by_id}?outcome=success"))
        .send()
        .await
        .unwrap();
    assert_eq!(released.status(), StatusCode::NO_CONTENT);
    assert_eq!(figures(&http, &base, "tenant:t1").await, (json!(3), 0));
    assert_eq!(one.in_flight("app:a1").await, 0);
    let (status, permit) = send(http.post(other.url("/v1/permits")).json(&body)).await;
    assert_eq!(status, StatusCode::CREATED);
    let by_id = one.url(&format!("/v1/permits/{}", permit["id"].as_str().unwrap()));
    assert_eq!(
        http.delete(&by_id).send().await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        figures(&http, &base, "tenant:t1").await,
        (json!(3), 0),
        "refunded"
    );
}

async fn committing_on_admission_charges_what_was_admitted<M: Make>() {
    let redis = M::redis();
    let mut settings = limits(1, 0);
    settings.quota.quota_commit = QuotaCommit::OnAdmission;
    let server = start_api(&settings, M::stores(&redis)).await;
    let (http, base) = (Client::new(), server.base.clone());
    send(
        http.put(server.url("/v1/quotas/t1"))
            .json(&json!({"balance": 5})),
    )
    .await;
    let permits = server.url("/v1/keys/app/permits");
    let charged = json!({"quota": {"key": "t1"}});
    let (status, permit) = send(http.post(&permits).json(&charged)).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        figures(&http, &base, "t1").await,
        (json!(4), 0),
        "spent at admission"
    );
    let (status, _) = send(http.post(&permits).json(&charged)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        figures(&http, &base, "t1").await,
        (json!(4), 0),
        "a refusal is never charged"
    );
    let one = format!(
        "{permits}/{}?outcome=failure",
        permit["id"].as_str().unwrap()
    );
    assert_eq!(
        http.delete(one).send().await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        figures(&http, &base, "t1").await,
        (json!(4), 0),
        "still spent"
    );
}

/// Work that outlasts `--quota-ttl` is still charged while its permit is renewed: each renewal, by key
/// and id or by id alone, extends the permit's reservation. A permit not renewed keeps its lease here
/// (10 s) but its reservation expires with the ttl: refunded, and its release then charges nothing.
async fn renewals_keep_a_charge_past_the_quota_ttl<M: Make>() {
    let redis = M::redis();
    let mut settings = limits(3, 0);
    settings.quota.quota_ttl = Duration::from_secs(1);
    let server = start_api(&settings, M::stores(&redis)).await;
    let (http, base) = (Client::new(), server.base.clone());
    let set = json!({"balance": 5});
    send(http.put(server.url("/v1/quotas/t1")).json(&set)).await;
    let permits = server.url("/v1/keys/app/permits");
    let charged = json!({"quota": {"key": "t1"}, "lease_ms": 10_000});
    let mut per_key = Vec::new();
    for _ in 0..2 {
        let (status, permit) = send(http.post(&permits).json(&charged)).await;
        assert_eq!(status, StatusCode::CREATED, "{permit}");
        per_key.push(format!("{permits}/{}", permit["id"].as_str().unwrap()));
    }
    let (renewed, idle) = (&per_key[0], &per_key[1]);
    let both = json!({"keys": ["app", "global"], "quota": {"key": "t1"}, "lease_ms": 10_000});
    let (status, permit) = send(http.post(server.url("/v1/permits")).json(&both)).await;
    assert_eq!(status, StatusCode::CREATED, "{permit}");
    let by_id = server.url(&format!("/v1/permits/{}", permit["id"].as_str().unwrap()));
    assert_eq!(figures(&http, &base, "t1").await, (json!(2), 3));
    // Three ttls of work, renewed every 400 ms.
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        for url in [renewed, &by_id] {
            let response = http.put(url).send().await.unwrap();
            assert_eq!(response.status(), StatusCode::OK, "{url}");
        }
    }
    assert_eq!(
        figures(&http, &base, "t1").await,
        (json!(3), 2),
        "the idle permit's reservation expired; the renewed ones are held"
    );
    for url in [renewed, &by_id, idle] {
        let response = http.delete(format!("{url}?outcome=success")).send().await;
        assert_eq!(response.unwrap().status(), StatusCode::NO_CONTENT, "{url}");
    }
    assert_eq!(
        figures(&http, &base, "t1").await,
        (json!(3), 0),
        "the renewed two committed, the idle one refunded"
    );
}

/// A renewal by id keeps a charged permit's record as long as its reservation, as the per-key renewal
/// does: a release after the record of a short lease would have gone (2 x lease + 1 s) still finds it
/// and commits the charge.
async fn a_renewal_by_id_keeps_the_record_as_long_as_the_reservation<M: Make>() {
    let redis = M::redis();
    let server = start_api(&limits(2, 0), M::stores(&redis)).await;
    let (http, base) = (Client::new(), server.base.clone());
    send(
        http.put(server.url("/v1/quotas/t1"))
            .json(&json!({"balance": 5})),
    )
    .await;
    let both = json!({"keys": ["app", "global"], "quota": {"key": "t1"}, "lease_ms": 300});
    let (status, permit) = send(http.post(server.url("/v1/permits")).json(&both)).await;
    assert_eq!(status, StatusCode::CREATED, "{permit}");
    let by_id = server.url(&format!("/v1/permits/{}", permit["id"].as_str().unwrap()));
    assert_eq!(
        http.put(&by_id).send().await.unwrap().status(),
        StatusCode::OK
    );
    // Past the record of a 300 ms lease (1.6 s), well within the reservation's hour.
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let released = http
        .delete(format!("{by_id}?outcome=success"))
        .send()
        .await
        .unwrap();
    assert_eq!(released.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        figures(&http, &base, "t1").await,
        (json!(4), 0),
        "committed"
    );
}

per_store!(
    a_permit_with_a_quota_settles_when_released,
    a_permit_on_several_keys_settles_through_any_server,
    committing_on_admission_charges_what_was_admitted,
    renewals_keep_a_charge_past_the_quota_ttl,
    a_renewal_by_id_keeps_the_record_as_long_as_the_reservation,
);
