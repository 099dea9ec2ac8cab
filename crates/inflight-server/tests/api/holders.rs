//! A key's holders and waiters listed (`GET /v1/keys/{key}/permits`), from this server and from a second
//! `inflight serve` on the same redis-server, paged; revoked (`DELETE .../permits/{id}?revoke=true`,
//! `DELETE .../waiters/{ticket}`), and what their holders hear; labels checked; the admin token that
//! guards all three.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use inflight_server::config::Layered;
use inflight_server::Settings;
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

use crate::common::process::{listen_of, Running};
use crate::common::{limits, metric, start_api, status_of, Make, Memory, Redis, TestRedis};
use crate::per_store;
use crate::{assert_error, body};

/// Settings with a limit of `limit` on the keys of class `{class}:*`: the counters are the test
/// process's, shared by every server in it, so a test counts revocations in a class of its own.
fn class_of_its_own(class: &str, limit: u32) -> Settings {
    let rule = format!("{class}:*={limit}");
    let mut settings = Settings::from_flags(["inflight", "--limit", &rule]).unwrap();
    settings.workers = Some(2);
    settings
}

/// `inflight_revocations_total` of class `{class}:*` and `kind`.
fn revocations(class: &str, kind: &str) -> String {
    format!("inflight_revocations_total{{class=\"{class}:*\",kind=\"{kind}\"}}")
}

/// A name of the test's own on its store: `{test}-memory`, or `{test}-redis` when it has a Redis.
fn own(redis: &Option<TestRedis>, test: &str) -> String {
    format!(
        "{test}-{}",
        if redis.is_some() { "redis" } else { "memory" }
    )
}

/// `POST {base}/v1/keys/{key}/permits` with `body`: the permit, once admitted.
async fn acquire(http: &Client, base: &str, key: &str, body: Value) -> Value {
    let answer = http
        .post(format!("{base}/v1/keys/{key}/permits"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED, "acquire {body}");
    crate::body(answer).await
}

/// One page of `key`'s holders and waiters at `base` (from `cursor`, when given).
async fn page(http: &Client, base: &str, key: &str, cursor: Option<&str>) -> Value {
    let mut request = http.get(format!("{base}/v1/keys/{key}/permits"));
    if let Some(cursor) = cursor {
        request = request.query(&[("cursor", cursor)]);
    }
    let answer = request.send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    body(answer).await
}

/// Lists `key` at `base` until it has `n` waiters (a waiting request takes its ticket a moment after it
/// is sent): that page. Bounded: panics after 10 s.
async fn with_waiters(http: &Client, base: &str, key: &str, n: usize) -> Value {
    let started = Instant::now();
    loop {
        let page = page(http, base, key, None).await;
        if page["waiters"].as_array().map(Vec::len) == Some(n) {
            return page;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{key} did not list {n} waiters: {page}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `text` with every byte but the unreserved ones percent-encoded (a ticket has a '#').
fn encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(byte).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

fn field_names(object: &Value) -> Vec<&str> {
    let mut names: Vec<&str> = object
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    names.sort_unstable();
    names
}

/// Key `{class}:app` of limit 3 on servers at `acquire_at` and `list_at` (the same one, or two processes
/// on one Redis): a labelled permit and a plain one listed with their fields; two requests waiting,
/// listed in queue order; the head revoked (409 revoked), the other admitted when a slot frees. The
/// server that revoked counts it.
async fn holders_and_waiters_are_listed_and_a_waiter_revoked(
    acquire_at: &str,
    list_at: &str,
    class: &str,
) {
    let http = Client::new();
    let key = format!("{class}:app");
    let labelled = json!({"id": "req-1", "weight": 2, "lease_ms": 60_000, "holder": "10.0.0.7"});
    let labelled = acquire(&http, acquire_at, &key, labelled).await;
    let plain = acquire(&http, acquire_at, &key, json!({})).await;

    let listed = page(&http, list_at, &key, None).await;
    assert_eq!(
        field_names(&listed),
        ["cursor", "holders", "key", "waiters"],
        "no unlisted slots: {listed}"
    );
    assert_eq!(
        (&listed["key"], &listed["cursor"], &listed["waiters"]),
        (&json!(key), &Value::Null, &json!([]))
    );
    let holders = listed["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 2, "{listed}");
    let find = |id: &Value| holders.iter().find(|h| h["id"] == *id).expect("listed");
    let one = find(&labelled["id"]);
    assert_eq!(
        field_names(one),
        [
            "admitted_at_ms",
            "holder",
            "id",
            "lease_expires_at_ms",
            "token",
            "weight"
        ]
    );
    assert_eq!(one["holder"], "10.0.0.7");
    assert_eq!(
        (&one["weight"], &one["token"]),
        (&json!(2), &labelled["token"])
    );
    assert_eq!(one["lease_expires_at_ms"], labelled["lease_expires_at_ms"]);
    let (admitted, expires) = (
        one["admitted_at_ms"].as_u64().unwrap(),
        one["lease_expires_at_ms"].as_u64().unwrap(),
    );
    assert!(admitted > 0 && admitted <= expires && expires - admitted <= 60_000);
    let other = find(&plain["id"]);
    assert!(other.get("holder").is_none(), "no label, no field: {other}");
    assert_eq!(other["weight"], 1);
    // (Redis keeps no token for a generated id's first lease: 0.)
    assert!(
        other["token"] == plain["token"] || other["token"] == 0,
        "{other}"
    );
    assert_eq!(other["lease_expires_at_ms"], plain["lease_expires_at_ms"]);
    assert!(other["admitted_at_ms"].as_u64().unwrap() <= expires);

    // Two requests wait on the full key: a labelled one of level 3 in a flow, a plain one.
    let permits = format!("{acquire_at}/v1/keys/{key}/permits");
    let wait = |body: Value| tokio::spawn(http.post(&permits).json(&body).send());
    let head = json!({"wait_ms": 30_000, "priority": 3, "flow": "tenant-a", "holder": "waiter-1"});
    let head = wait(head);
    with_waiters(&http, list_at, &key, 1).await;
    let behind = wait(json!({"wait_ms": 30_000}));
    let listed = with_waiters(&http, list_at, &key, 2).await;
    let waiters = listed["waiters"].as_array().unwrap();
    assert_eq!(
        field_names(&waiters[0]),
        [
            "flow",
            "holder",
            "priority",
            "ticket",
            "waiting_since_ms",
            "weight"
        ]
    );
    assert_eq!(
        (
            &waiters[0]["priority"],
            &waiters[0]["flow"],
            &waiters[0]["weight"]
        ),
        (&json!(3), &json!("tenant-a"), &json!(1))
    );
    assert_eq!(waiters[0]["holder"], "waiter-1");
    assert!(waiters[0]["waiting_since_ms"].as_u64().unwrap() > 0);
    assert_eq!(
        (&waiters[1]["priority"], &waiters[1]["flow"]),
        (&json!(0), &Value::Null),
        "the default flow is null"
    );
    assert!(waiters[1].get("holder").is_none());

    let ticket = waiters[0]["ticket"].as_str().unwrap();
    let revoke = format!("{list_at}/v1/keys/{key}/waiters/{}", encode(ticket));
    assert_eq!(
        status_of(http.delete(&revoke)).await,
        StatusCode::NO_CONTENT
    );
    assert_error(
        head.await.unwrap().unwrap(),
        StatusCode::CONFLICT,
        "revoked",
    )
    .await;
    let listed = with_waiters(&http, list_at, &key, 1).await;
    assert_eq!(listed["waiters"][0]["ticket"], waiters[1]["ticket"]);
    let again = http.delete(&revoke).send().await.unwrap();
    assert_error(again, StatusCode::NOT_FOUND, "waiter_not_found").await;

    // The other waiter was left alone: admitted when the plain permit is released.
    let released = http.delete(format!("{permits}/{}", plain["id"].as_str().unwrap()));
    assert_eq!(status_of(released).await, StatusCode::NO_CONTENT);
    assert_eq!(behind.await.unwrap().unwrap().status(), StatusCode::CREATED);
    with_waiters(&http, list_at, &key, 0).await;
    let metrics = format!("{list_at}/metrics");
    assert_eq!(
        metric(&http, &metrics, &revocations(class, "waiter")).await,
        1.0
    );
    assert_eq!(
        metric(&http, &metrics, &revocations(class, "holder")).await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_and_waiters_are_listed_by_one_server_on_the_memory_store() {
    let class = "listed-memory";
    let server = start_api(&class_of_its_own(class, 3), Memory::stores(&None)).await;
    holders_and_waiters_are_listed_and_a_waiter_revoked(&server.base, &server.base, class).await;
}

/// Admitted through one server, listed and revoked through another process on the same redis-server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_and_waiters_are_listed_by_another_process_on_redis() {
    let (redis, class) = (Redis::redis(), "listed-redis");
    let server = start_api(&class_of_its_own(class, 3), Redis::stores(&redis)).await;
    let (url, rule) = (redis.as_ref().unwrap().url(), format!("{class}:*=3"));
    let (_other, started) = Running::start(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--limit",
        &rule,
        "--store",
        &url,
    ]);
    let other = format!("http://{}", listen_of(&started));
    holders_and_waiters_are_listed_and_a_waiter_revoked(&server.base, &other, class).await;
}

/// 250 holders: every one listed at least once across the pages (about 100 each), then the cursor
/// `null`; a cursor that is not one and an unknown parameter are 400.
async fn every_holder_is_listed_across_pages<M: Make>() {
    let redis = M::redis();
    let server = start_api(&limits(1000, 0), M::stores(&redis)).await;
    let http = Client::new();
    let mut ids = HashSet::new();
    for chunk in 0..10 {
        let admitted = (0..25).map(|i| {
            let label = format!("client-{}", chunk * 25 + i);
            acquire(&http, &server.base, "app", json!({"holder": label}))
        });
        for permit in futures_util::future::join_all(admitted).await {
            ids.insert(permit["id"].as_str().unwrap().to_owned());
        }
    }
    let (mut seen, mut labels) = (HashSet::new(), HashSet::new());
    let (mut cursor, mut pages) = (None::<String>, 0);
    loop {
        let listed = page(&http, &server.base, "app", cursor.as_deref()).await;
        let holders = listed["holders"].as_array().unwrap();
        assert!(holders.len() <= 200, "a page is bounded: {}", holders.len());
        for holder in holders {
            seen.insert(holder["id"].as_str().unwrap().to_owned());
            labels.insert(holder["holder"].as_str().unwrap().to_owned());
        }
        pages += 1;
        assert!(pages < 100, "the pages end");
        match listed["cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
        assert!(listed["waiters"].as_array().unwrap().is_empty());
    }
    assert_eq!(seen, ids, "every holder listed at least once");
    assert_eq!(labels.len(), 250);
    assert!(pages >= 2, "paged: {pages}");

    let url = server.url("/v1/keys/app/permits");
    for query in [
        "cursor=not-a-cursor",
        "cursor=a%0Ab",
        "limit=5",
        "cursor=0&prefix=a",
    ] {
        let answer = http.get(format!("{url}?{query}")).send().await.unwrap();
        assert_error(answer, StatusCode::BAD_REQUEST, "invalid_request").await;
    }
    // The key's slots are untouched by listing.
    assert_eq!(server.in_flight("app").await, 250);
}

/// A holder revoked: 204, its slot free at once, its holder's renewal 404 (not taken back, though there
/// is room), a second revoke 404 holder_not_found; counted once. The id route takes no `?revoke=true`.
async fn a_revoked_holder_frees_its_slot_and_its_renewal_is_refused<M: Make>() {
    let redis = M::redis();
    let class = own(&redis, "revoked");
    let server = start_api(&class_of_its_own(&class, 1), M::stores(&redis)).await;
    let http = Client::new();
    let key = format!("{class}:app");
    let permits = server.url(&format!("/v1/keys/{key}/permits"));
    let labelled = json!({"lease_ms": 60_000, "holder": "stuck stream"});
    let held = acquire(&http, &server.base, &key, labelled).await;
    assert_eq!(status_of(http.post(&permits)).await, 429);
    let id = held["id"].as_str().unwrap();
    let on_id_route = http.delete(server.url(&format!("/v1/permits/{id}?revoke=true")));
    assert_error(
        on_id_route.send().await.unwrap(),
        StatusCode::BAD_REQUEST,
        "invalid_request",
    )
    .await;

    let revoke = format!("{permits}/{id}?revoke=true");
    assert_eq!(
        status_of(http.delete(&revoke)).await,
        StatusCode::NO_CONTENT
    );
    let listed = page(&http, &server.base, &key, None).await;
    assert_eq!(listed["holders"], json!([]), "gone from the listing");
    let taken = acquire(&http, &server.base, &key, json!({})).await;
    let release = http.delete(format!("{permits}/{}", taken["id"].as_str().unwrap()));
    assert_eq!(status_of(release).await, StatusCode::NO_CONTENT);

    let renewal = http
        .put(format!("{permits}/{id}"))
        .json(&json!({"token": held["token"]}));
    assert_error(
        renewal.send().await.unwrap(),
        StatusCode::NOT_FOUND,
        "permit_not_found",
    )
    .await;
    assert_eq!(server.in_flight(&key).await, 0, "not taken back");
    let again = http.delete(&revoke).send().await.unwrap();
    assert_error(again, StatusCode::NOT_FOUND, "holder_not_found").await;
    let metrics = server.url("/metrics");
    let holder = metric(&http, &metrics, &revocations(&class, "holder")).await;
    let waiter = metric(&http, &metrics, &revocations(&class, "waiter")).await;
    assert_eq!((holder, waiter), (1.0, 0.0));
    // Its holder's own release after the revocation is the plain release: 204, as for any gone permit.
    assert_eq!(
        status_of(http.delete(format!("{permits}/{id}"))).await,
        StatusCode::NO_CONTENT
    );
}

/// `"holder"` in either acquire body: 1 to 128 bytes without control characters, else 400.
async fn a_bad_holder_label_is_refused<M: Make>() {
    let redis = M::redis();
    let server = start_api(&limits(5, 0), M::stores(&redis)).await;
    let http = Client::new();
    let (one, several) = (
        server.url("/v1/keys/app/permits"),
        server.url("/v1/permits"),
    );
    let long = "h".repeat(129);
    for bad in [
        json!(""),
        json!(long),
        json!("a\nb"),
        json!("tab\there"),
        json!(7),
    ] {
        let answer = http.post(&one).json(&json!({ "holder": bad })).send();
        assert_error(
            answer.await.unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        )
        .await;
        let answer = http
            .post(&several)
            .json(&json!({"keys": ["app"], "holder": bad}));
        assert_error(
            answer.send().await.unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        )
        .await;
    }
    assert_eq!(server.in_flight("app").await, 0, "nothing admitted");
    let longest = "é".repeat(64); // 128 bytes
    acquire(&http, &server.base, "app", json!({ "holder": longest })).await;
    let several = http
        .post(&several)
        .json(&json!({"keys": ["app", "b"], "holder": "worker 7"}));
    assert_eq!(status_of(several).await, StatusCode::CREATED);
    let listed = page(&http, &server.base, "app", None).await;
    let mut labels: Vec<&str> = listed["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["holder"].as_str().unwrap())
        .collect();
    labels.sort_unstable();
    assert_eq!(labels, ["worker 7", longest.as_str()]);
}

per_store!(
    every_holder_is_listed_across_pages,
    a_revoked_holder_frees_its_slot_and_its_renewal_is_refused,
    a_bad_holder_label_is_refused,
);

/// `--admin-token`, with and without `--api-token`: listing holders and revoking need the admin token
/// (the API token is refused); releasing one's own permit and the busy keys stay as open as before, and
/// the busy keys show no ids or tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_and_revoking_need_the_admin_token() {
    for api_token in [None, Some("api-s3cret")] {
        let settings = Settings {
            admin_token: Some("admin-s3cret".into()),
            api_token: api_token.map(String::from),
            ..limits(5, 0)
        };
        let server = start_api(&settings, Memory::stores(&None)).await;
        let http = Client::new();
        let with = |request: reqwest::RequestBuilder, token: Option<&str>| match token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        let permits = server.url("/v1/keys/app/permits");
        let admitted = with(http.post(&permits), api_token).json(&json!({"holder": "h-1"}));
        let held = body(admitted.send().await.unwrap()).await;
        let id = held["id"].as_str().unwrap();
        let revoke = format!("{permits}/{id}?revoke=true");
        let waiter = server.url("/v1/keys/app/waiters/t%231");
        for user in [None, api_token, Some("guess")] {
            for request in [
                http.get(&permits),
                http.delete(&revoke),
                http.delete(&waiter),
            ] {
                let answer = with(request, user).send().await.unwrap();
                assert_error(answer, StatusCode::UNAUTHORIZED, "unauthorized").await;
            }
        }
        assert_eq!(server.in_flight("app").await, 1, "nothing revoked");

        let busy = with(http.get(server.url("/v1/keys")), api_token)
            .send()
            .await;
        let busy = busy.unwrap();
        assert_eq!(busy.status(), StatusCode::OK, "as open as before");
        let busy = busy.text().await.unwrap();
        assert!(!busy.contains(id) && !busy.contains("h-1"), "{busy}");
        let busy: Value = serde_json::from_str(&busy).unwrap();
        assert_eq!(busy["keys"][0]["key"], "app");
        assert_eq!(field_names(&busy["keys"][0]), ["in_flight", "key", "limit"]);

        let admin = Some("admin-s3cret");
        let listed = body(with(http.get(&permits), admin).send().await.unwrap()).await;
        assert_eq!(listed["holders"][0]["id"], id);
        let unknown = with(http.delete(&waiter), admin).send().await.unwrap();
        assert_error(unknown, StatusCode::NOT_FOUND, "waiter_not_found").await;
        let revoked = with(http.delete(&revoke), admin);
        assert_eq!(status_of(revoked).await, StatusCode::NO_CONTENT);

        // A plain release needs no more than it did.
        let own = with(http.post(&permits), api_token).send().await.unwrap();
        let own = body(own).await;
        let release = http.delete(format!("{permits}/{}", own["id"].as_str().unwrap()));
        assert_eq!(
            status_of(with(release, api_token)).await,
            StatusCode::NO_CONTENT
        );
    }
}
