//! Permits on several keys over HTTP (`/v1/permits`), classes of keys (`--limit`, `[[limits]]`) and
//! their reload on SIGHUP, against a real HTTP client, on the memory and the Redis store.
#![allow(missing_docs)]

mod common;

use std::time::{Duration, Instant};

use common::process::{listen_of, Running};
use common::{get_json, start_api, Make, Memory, Redis, TestRedis};
use inflight_server::config::Layered;
use inflight_server::Settings;
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

/// Settings with the classes of the example (tenants 2, apps 1, a global 10).
fn classes() -> Settings {
    let flags = [
        "inflight",
        "--limit",
        "tenant:*=2,max=3",
        "--limit",
        "app:*=1",
        "--limit",
        "global=10",
        "--workers",
        "2",
    ];
    Settings::from_flags(flags).expect("valid test settings")
}

async fn post(http: &Client, url: &str, body: Value) -> (StatusCode, Value) {
    let response = http.post(url).json(&body).send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn now_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.unwrap().as_millis() as i64
}

/// (key, limit, in_flight) of each key of a permit's answer.
fn figures(body: &Value) -> Vec<(String, Value, u64)> {
    body["keys"]
        .as_array()
        .unwrap_or_else(|| panic!("no keys in {body}"))
        .iter()
        .map(|k| {
            let key = k["key"].as_str().unwrap().to_owned();
            (key, k["limit"].clone(), k["in_flight"].as_u64().unwrap())
        })
        .collect()
}

async fn several_keys_are_taken_together_or_not_at_all<M: Make>() {
    let redis = M::redis();
    let server = start_api(&classes(), M::stores(&redis)).await;
    let http = Client::new();
    let permits = server.url("/v1/permits");

    let keys = json!(["tenant:t1", "app:a1", "global", "user:free"]);
    let (status, first) = post(&http, &permits, json!({"keys": keys, "id": "req-1"})).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert_eq!(first["id"], "req-1");
    assert_eq!(first["weight"], 1);
    assert!(first["lease_expires_at_ms"].as_u64().unwrap() > 0);
    let want = |t: u64, a: u64, g: u64| {
        vec![
            ("tenant:t1".to_owned(), json!(2), t),
            ("app:a1".to_owned(), json!(1), a),
            ("global".to_owned(), json!(10), g),
            ("user:free".to_owned(), Value::Null, 0),
        ]
    };
    assert_eq!(figures(&first), want(1, 1, 1));

    // The app is full: refused, and the refusal names it and takes nothing.
    let (status, refused) = post(&http, &permits, json!({"keys": ["tenant:t1", "app:a1"]})).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        (refused["code"].as_str(), refused["key"].as_str()),
        (Some("too_many_requests"), Some("app:a1"))
    );
    let (status, _) = post(&http, &permits, json!({"keys": ["tenant:t1", "app:a2"]})).await;
    assert_eq!(status, StatusCode::CREATED);
    // Now the tenant is: a third app of it is refused under the tenant's name.
    let response = http
        .post(&permits)
        .json(&json!({"keys": ["app:a3", "tenant:t1"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["retry-after"], "1");
    let refused: Value = response.json().await.unwrap();
    assert_eq!(refused["key"], "tenant:t1");
    let app3 = get_json(&http, server.url("/v1/keys/app:a3")).await;
    assert_eq!(
        (app3["limit"].as_u64(), app3["in_flight"].as_u64()),
        (Some(1), Some(0))
    );
    // The class's ceiling caps an override.
    let capped = http
        .put(server.url("/v1/keys/tenant:t2/limit"))
        .json(&json!({"limit": 50}))
        .send()
        .await
        .unwrap();
    assert_eq!(capped.json::<Value>().await.unwrap()["limit"], 3);

    // Renewed and released by id alone.
    let one = server.url("/v1/permits/req-1");
    let renewed = http
        .put(&one)
        .json(&json!({"lease_ms": 60000}))
        .send()
        .await
        .unwrap();
    assert_eq!(renewed.status(), StatusCode::OK);
    let renewed: Value = renewed.json().await.unwrap();
    assert_eq!(renewed["id"], "req-1");
    assert_eq!(figures(&renewed), want(2, 1, 1));
    assert_eq!(
        http.delete(&one).send().await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        http.delete(&one).send().await.unwrap().status(),
        StatusCode::NO_CONTENT,
        "twice"
    );
    let gone = http.put(&one).send().await.unwrap();
    assert_eq!(gone.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        gone.json::<Value>().await.unwrap()["code"],
        "permit_not_found"
    );
    for key in ["app:a1", "global"] {
        assert_eq!(server.in_flight(key).await, 0, "{key} released");
    }
    assert_eq!(server.in_flight("tenant:t1").await, 1, "app:a2's");

    // A permit on keys that are all unlimited holds nothing: no lease, nothing recorded to renew.
    let (status, free) = post(
        &http,
        &permits,
        json!({"keys": ["user:a", "user:b"], "id": "free-1"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(free["lease_expires_at_ms"], Value::Null);
    let free_url = server.url("/v1/permits/free-1");
    assert_eq!(
        http.put(&free_url).send().await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        http.delete(&free_url).send().await.unwrap().status(),
        StatusCode::NO_CONTENT
    );

    // A renewal without a length keeps the permit's own, and so does its record.
    let (status, _) = post(
        &http,
        &permits,
        json!({"keys": ["tenant:t9", "app:a9"], "id": "long", "lease_ms": 600000}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let long = server.url("/v1/permits/long");
    for _ in 0..2 {
        let renewed: Value = http.put(&long).send().await.unwrap().json().await.unwrap();
        let left = renewed["lease_expires_at_ms"].as_u64().unwrap() as i64 - now_ms();
        assert!(left > 500_000, "{left} ms left: the lease's own 10 min");
    }
    assert_eq!(
        http.delete(&long).send().await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(server.in_flight("app:a9").await, 0);

    // Repeated keys count once.
    let (status, twice) = post(&http, &permits, json!({"keys": ["app:x", "app:x"]})).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(figures(&twice), vec![("app:x".to_owned(), json!(1), 1)]);
}

async fn bad_permit_requests_are_refused_clearly<M: Make>() {
    let redis = M::redis();
    let server = start_api(&classes(), M::stores(&redis)).await;
    let http = Client::new();
    let permits = server.url("/v1/permits");
    let many: Vec<String> = (0..17).map(|n| format!("k{n}")).collect();
    let cases = [
        (json!({"keys": []}), "invalid_request"),
        (json!({"keys": many}), "invalid_request"),
        (json!({"keys": ["ok", "tab\there"]}), "invalid_key"),
        (json!({"keys": [""]}), "invalid_key"),
        (json!({"keys": ["a"], "weight": 0}), "invalid_request"),
        (json!({"keys": ["a"], "lease_ms": 0}), "invalid_request"),
        (json!({"keys": ["a"], "colour": "red"}), "invalid_request"),
        (json!({"key": "a"}), "invalid_request"),
        (json!({"keys": "a"}), "invalid_request"),
    ];
    for (body, code) in cases {
        let (status, answer) = post(&http, &permits, body.clone()).await;
        assert_eq!(
            (status, answer["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some(code)),
            "{body}"
        );
    }
    let raw = http.post(&permits).body("{not json").send().await.unwrap();
    assert_eq!(raw.status(), StatusCode::BAD_REQUEST);
    let wrong = http.get(&permits).send().await.unwrap();
    assert_eq!(wrong.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(
        http.delete(server.url("/v1/permits/never"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        http.put(server.url("/v1/permits/never"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn several_keys_are_taken_together_or_not_at_all_on_memory() {
    several_keys_are_taken_together_or_not_at_all::<Memory>().await;
}

#[tokio::test]
async fn several_keys_are_taken_together_or_not_at_all_on_redis() {
    several_keys_are_taken_together_or_not_at_all::<Redis>().await;
}

#[tokio::test]
async fn bad_permit_requests_are_refused_clearly_on_memory() {
    bad_permit_requests_are_refused_clearly::<Memory>().await;
}

#[tokio::test]
async fn bad_permit_requests_are_refused_clearly_on_redis() {
    bad_permit_requests_are_refused_clearly::<Redis>().await;
}

/// Two servers on one Redis, as two hosts behind a load balancer: a permit taken through one is renewed
/// and released through the other, by its id alone.
#[tokio::test]
async fn a_permit_taken_through_one_server_is_renewed_and_released_through_another() {
    let redis = Some(TestRedis::start());
    let one = start_api(&classes(), Redis::stores(&redis)).await;
    let two = start_api(&classes(), Redis::stores(&redis)).await;
    let http = Client::new();
    let (status, taken) = post(
        &http,
        &one.url("/v1/permits"),
        json!({"keys": ["tenant:t", "app:a"]}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let id = taken["id"].as_str().unwrap();
    let there = two.url(&format!("/v1/permits/{id}"));
    let renewed = http.put(&there).send().await.unwrap();
    assert_eq!(renewed.status(), StatusCode::OK);
    assert_eq!(
        figures(&renewed.json().await.unwrap())[1],
        ("app:a".to_owned(), json!(1), 1)
    );
    assert_eq!(
        http.delete(&there).send().await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(one.in_flight("app:a").await, 0);
    assert_eq!(one.in_flight("tenant:t").await, 0);
}

/// SIGHUP re-reads the file: new limits apply at once, held permits stay, and a bad file changes nothing.
#[tokio::test]
async fn sighup_reloads_the_limits_and_keeps_held_permits() {
    let dir = std::env::temp_dir().join(format!("inflight-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("inflight.toml");
    let write = |default: u32| {
        let text = format!("[[limits]]\nkeys = \"app:*\"\ndefault = {default}\n");
        std::fs::write(&file, text).unwrap();
    };
    write(1);
    let config = file.to_str().unwrap().to_owned();
    let (mut server, started) =
        Running::start(&["serve", "--listen", "127.0.0.1:0", "--config", &config]);
    let base = format!("http://{}", listen_of(&started));
    let http = Client::new();
    let limit_of = |key: &'static str| {
        let (http, url) = (http.clone(), format!("{base}/v1/keys/{key}"));
        async move { get_json(&http, url).await }
    };
    assert_eq!(limit_of("app:x").await["limit"], 1);
    assert_eq!(limit_of("user:x").await["limit"], Value::Null);
    let held = post(&http, &format!("{base}/v1/keys/app:x/permits"), json!({})).await;
    assert_eq!(held.0, StatusCode::CREATED);

    write(3);
    server.signal("-HUP");
    let deadline = Instant::now() + Duration::from_secs(5);
    while limit_of("app:x").await["limit"] != 3 {
        assert!(Instant::now() < deadline, "the new limit never applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let now = limit_of("app:x").await;
    assert_eq!(
        now["in_flight"], 1,
        "the permit held before the reload stays held"
    );
    let more = post(&http, &format!("{base}/v1/keys/app:x/permits"), json!({})).await;
    assert_eq!(more.0, StatusCode::CREATED, "room under the new limit");

    // Floors come with the limits: 2 of app:*'s 3 slots kept for level 9 once it holds one.
    let floored =
        "[[limits]]\nkeys = \"app:*\"\ndefault = 3\nfloors = [{ priority = 9, slots = 2 }]\n";
    std::fs::write(&file, floored).unwrap();
    server.signal("-HUP");
    let permits = format!("{base}/v1/keys/app:x/permits");
    let id = more.1["id"].as_str().unwrap().to_owned();
    let gone = http.delete(format!("{permits}/{id}")).send().await.unwrap();
    assert_eq!(gone.status(), StatusCode::NO_CONTENT);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        // Level 9 holds one (below its floor of 2): a level-0 admission must leave one more free.
        let high = post(&http, &permits, json!({"priority": 9})).await;
        assert_eq!(high.0, StatusCode::CREATED);
        let low = post(&http, &permits, json!({})).await;
        let high_id = high.1["id"].as_str().unwrap().to_owned();
        http.delete(format!("{permits}/{high_id}"))
            .send()
            .await
            .unwrap();
        if low.0 == StatusCode::TOO_MANY_REQUESTS {
            break;
        }
        let low_id = low.1["id"].as_str().unwrap().to_owned();
        http.delete(format!("{permits}/{low_id}"))
            .send()
            .await
            .unwrap();
        assert!(Instant::now() < deadline, "the floor never applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    std::fs::write(&file, "[[limits]]\nkeys = \"\"\n").unwrap();
    server.signal("-HUP");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(server.is_running(), "a bad file does not stop the server");
    assert_eq!(limit_of("app:x").await["limit"], 3, "and changes nothing");
    server.signal("-TERM");
    assert!(server.wait_for(Duration::from_secs(10)).success());
    let log = server.rest_of_log().join("\n");
    assert!(log.contains("limits reloaded"), "{log}");
    assert!(log.contains("reload refused"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// With Redis gone under fail_closed, a key no rule limits and with no override is still admitted (no
/// store needed); a key with an override is refused with 503.
#[tokio::test]
async fn with_redis_gone_unlimited_keys_are_admitted_and_overridden_ones_refused() {
    let mut redis = Some(TestRedis::start());
    let server = start_api(&classes(), Redis::stores(&redis)).await;
    let http = Client::new();
    let set = http
        .put(server.url("/v1/keys/user:vip/limit"))
        .json(&json!({"limit": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), StatusCode::OK);
    // Every worker's view has read the index and heard of the override by now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.as_mut().unwrap().stop();
    for n in 0..20 {
        let url = server.url(&format!("/v1/keys/user:{n}/permits"));
        let (status, body) = post(&http, &url, json!({})).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let (status, body) = post(&http, &server.url("/v1/keys/user:vip/permits"), json!({})).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["code"], "store_unavailable");
    let (status, _) = post(&http, &server.url("/v1/keys/app:a/permits"), json!({})).await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "a class with a limit needs the store"
    );
}
