//! Fencing tokens over HTTP: in every admission's answer, named by renewals and releases, so that a
//! late release of an earlier admission of an id leaves a later one's lease; and one id names one
//! permit on several keys.

use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

use crate::common::{limits, start_api, Make};
use crate::per_store;
use crate::{assert_error, body};

async fn post(http: &Client, url: &str, json: Value) -> Value {
    let answer = http.post(url).json(&json).send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED);
    body(answer).await
}

async fn a_late_release_of_an_earlier_admission_leaves_the_later_one<M: Make>() {
    let redis = M::redis();
    let server = start_api(&limits(1, 0), M::stores(&redis)).await;
    let http = Client::new();
    let url = server.url("/v1/keys/app/permits");
    let first = post(&http, &url, json!({"id": "job-7"})).await;
    let first_token = first["token"].as_u64().unwrap();
    assert!(first_token > 0);
    let release = |token: u64| {
        let url = server.url(&format!("/v1/keys/app/permits/job-7?token={token}"));
        http.delete(url).send()
    };
    assert_eq!(
        release(first_token).await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    let second = post(&http, &url, json!({"id": "job-7"})).await;
    let second_token = second["token"].as_u64().unwrap();
    assert!(second_token > first_token);
    // The first release again (a client's retry): the later admission keeps its slot.
    assert_eq!(
        release(first_token).await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(server.in_flight("app").await, 1);
    let full = http.post(&url).send().await.unwrap();
    assert_eq!(full.status(), StatusCode::TOO_MANY_REQUESTS);
    // A renewal naming the first admission finds nothing of its own; the second's renews.
    let renew = |token: u64| {
        let url = server.url("/v1/keys/app/permits/job-7");
        http.put(url).json(&json!({"token": token})).send()
    };
    let stale = renew(first_token).await.unwrap();
    assert_error(stale, StatusCode::NOT_FOUND, "permit_not_found").await;
    let renewed = body(renew(second_token).await.unwrap()).await;
    assert_eq!(renewed["token"].as_u64(), Some(second_token));
    assert_eq!(
        release(second_token).await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(server.in_flight("app").await, 0);
    let bad = server.url("/v1/keys/app/permits/job-7?token=soon");
    let bad = http.delete(bad).send().await.unwrap();
    assert_error(bad, StatusCode::BAD_REQUEST, "invalid_request").await;
}

async fn one_id_names_one_permit_on_several_keys<M: Make>() {
    // The ninth finding: the same id on another key set was admitted and recorded over the
    // first, whose keys then stayed held until their leases ended.
    let redis = M::redis();
    let server = start_api(&limits(2, 0), M::stores(&redis)).await;
    let http = Client::new();
    let url = server.url("/v1/permits");
    let first = post(&http, &url, json!({"keys": ["a", "b"], "id": "Z"})).await;
    assert!(first["token"].as_u64().unwrap() > 0);
    let other = http
        .post(&url)
        .json(&json!({"keys": ["c", "d"], "id": "Z"}))
        .send()
        .await
        .unwrap();
    assert_error(other, StatusCode::CONFLICT, "permit_id_in_use").await;
    for key in ["c", "d"] {
        assert_eq!(server.in_flight(key).await, 0, "{key}");
    }
    // The same keys again: the same permit (taken over by the later admission).
    let again = post(&http, &url, json!({"keys": ["a", "b"], "id": "Z"})).await;
    assert!(again["token"].as_u64() > first["token"].as_u64());
    // A late release of the first admission by id leaves the later one's lease and its record.
    let late = server.url(&format!("/v1/permits/Z?token={}", first["token"]));
    let late = http.delete(late).send().await.unwrap();
    assert_eq!(late.status(), StatusCode::NO_CONTENT);
    assert_eq!(server.in_flight("a").await, 1);
    let renewal = json!({"token": again["token"]});
    let renewed = http.put(server.url("/v1/permits/Z")).json(&renewal);
    assert_eq!(renewed.send().await.unwrap().status(), StatusCode::OK);
    let released = http
        .delete(server.url("/v1/permits/Z"))
        .send()
        .await
        .unwrap();
    assert_eq!(released.status(), StatusCode::NO_CONTENT);
    for key in ["a", "b", "c", "d"] {
        assert_eq!(server.in_flight(key).await, 0, "{key}");
    }
    // Released, the id is free for other keys.
    post(&http, &url, json!({"keys": ["c", "d"], "id": "Z"})).await;
}

per_store!(
    a_late_release_of_an_earlier_admission_leaves_the_later_one,
    one_id_names_one_permit_on_several_keys,
);
