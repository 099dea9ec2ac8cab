//! `inflight` in a Dify deployment: the store from Dify's own `REDIS_*` variables, and `--layout dify`
//! beside a worker that does what Dify's `RateLimit` does. Runs the real binary on a real redis-server.
#![allow(missing_docs)]

mod common;

use common::process::{listen_of, Running};
use common::TestRedis;
use redis::Commands;
use serde_json::json;

const HASH: &str = "dify:rate_limit:app-1:active_requests";

#[tokio::test]
async fn difys_redis_variables_name_the_store_and_the_password_stays_out_of_the_log() {
    let redis = TestRedis::start();
    let port = redis.port().to_string();
    let env = [
        ("REDIS_HOST", "127.0.0.1"),
        ("REDIS_PORT", port.as_str()),
        ("REDIS_DB", "3"),
        ("INFLIGHT_DEFAULT_LIMIT", "2"),
    ];
    let (server, started) = Running::start_with_env(&["serve", "--listen", "127.0.0.1:0"], &env);
    assert!(
        started.contains(&format!("store=redis://127.0.0.1:{port}/3"))
            && started.contains("store_from=\"Dify's REDIS_* variables\""),
        "{started}"
    );
    // Admissions go to that Redis, database 3.
    let base = format!("http://{}", listen_of(&started));
    let client = reqwest::Client::new();
    let permit = client
        .post(format!("{base}/v1/keys/app-1/permits"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(permit.status(), 201);
    let mut conn = redis.client();
    let _: () = redis::cmd("SELECT").arg(3).query(&mut conn).unwrap();
    let keys: Vec<String> = conn.keys("inflight:*").unwrap();
    assert!(!keys.is_empty(), "nothing in database 3");
    server.signal("-TERM");

    // A password is masked; --store (or INFLIGHT_STORE) wins over the variables.
    let secret = [
        ("REDIS_HOST", "127.0.0.1"),
        ("REDIS_PASSWORD", "hunter2-secret"),
    ];
    let (_masked, started) =
        Running::start_with_env(&["serve", "--listen", "127.0.0.1:0"], &secret);
    assert!(
        started.contains("store=redis://***@127.0.0.1:6379/0") && !started.contains("hunter2"),
        "{started}"
    );
    let (_explicit, started) = Running::start_with_env(
        &["serve", "--listen", "127.0.0.1:0", "--store", "memory://"],
        &secret,
    );
    assert!(
        started.contains("store=memory://") && started.contains("store_from=\"store\""),
        "{started}"
    );
}

/// `inflight serve --layout dify` on `url`, default limit 3, with these variables.
fn serve_dify(url: &str, env: &[(&str, &str)]) -> (Running, String) {
    let args = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--store",
        url,
        "--layout",
        "dify",
        "--default-limit",
        "3",
    ];
    Running::start_with_env(&args, env)
}

#[tokio::test]
async fn layout_dify_shares_one_cap_with_difys_workers_over_http() {
    let redis = TestRedis::start();
    let url = redis.url();
    let (_server, started) = serve_dify(&url, &[]);
    assert!(started.contains("layout=Dify"), "{started}");
    let base = format!("http://{}", listen_of(&started));
    let client = reqwest::Client::new();
    // A Dify worker holds one (HLEN, then HSET of time.time()).
    let mut conn = redis.client();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut conn).unwrap();
    let now = secs as f64 + micros as f64 / 1e6;
    let _: () = conn.hset(HASH, "dify-req", now.to_string()).unwrap();
    let acquire = || {
        client
            .post(format!("{base}/v1/keys/app-1/permits"))
            .json(&json!({}))
            .send()
    };
    assert_eq!(acquire().await.unwrap().status(), 201);
    let second: serde_json::Value = acquire().await.unwrap().json().await.unwrap();
    assert_eq!(second["in_flight"], 3, "{second}");
    assert_eq!(acquire().await.unwrap().status(), 429);
    let len: usize = conn.hlen(HASH).unwrap();
    assert_eq!(len, 3);
    // Setting the app's limit writes Dify's key; Dify's exit frees a slot for inflight.
    let set = client
        .put(format!("{base}/v1/keys/app-1/limit"))
        .json(&json!({"limit": 5}))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), 200);
    let written: String = conn
        .get("dify:rate_limit:app-1:max_active_requests")
        .unwrap();
    assert_eq!(written, "5");
    let _: () = conn.hdel(HASH, "dify-req").unwrap();
    let status: serde_json::Value = client
        .get(format!("{base}/v1/keys/app-1"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (status["limit"].clone(), status["in_flight"].clone()),
        (json!(5), json!(2))
    );
    // Weights are refused clearly, not with a 5xx.
    let heavy = client
        .post(format!("{base}/v1/keys/app-1/permits"))
        .json(&json!({"weight": 2}))
        .send()
        .await
        .unwrap();
    assert!(heavy.status().is_client_error(), "{}", heavy.status());
}

/// With Dify's `REDIS_KEY_PREFIX` (read from Dify's variable, surrounding spaces dropped), `--layout dify`
/// counts and reads the limit where released Dify (1.14 to 1.16.1) does: its `RedisClientWrapper` puts
/// `<prefix>:` before the names `hlen`, `hset`, `hdel`, `get` and `setex` take, so both of an app's keys
/// are `<prefix>:dify:...`; a Dify worker's entry there counts, and nothing lands in the unprefixed hash.
#[tokio::test]
async fn layout_dify_applies_difys_key_prefix_as_dify_does() {
    let redis = TestRedis::start();
    let url = redis.url();
    let (_server, started) = serve_dify(&url, &[("REDIS_KEY_PREFIX", " tenant-a ")]);
    let base = format!("http://{}", listen_of(&started));
    let client = reqwest::Client::new();
    let mut conn = redis.client();
    let limit_key = "tenant-a:dify:rate_limit:app-1:max_active_requests";
    let prefixed_hash = "tenant-a:dify:rate_limit:app-1:active_requests";
    let _: () = conn.set_ex(limit_key, "2", 86_400).unwrap();
    // A released Dify worker with the prefix holds one (HLEN, then HSET of time.time()).
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut conn).unwrap();
    let now = secs as f64 + micros as f64 / 1e6;
    let _: () = conn
        .hset(prefixed_hash, "dify-req", now.to_string())
        .unwrap();
    let acquire = || {
        client
            .post(format!("{base}/v1/keys/app-1/permits"))
            .json(&json!({}))
            .send()
    };
    let first: serde_json::Value = acquire().await.unwrap().json().await.unwrap();
    assert_eq!(
        (first["limit"].clone(), first["in_flight"].clone()),
        (json!(2), json!(2)),
        "the prefixed keys are the app's: {first}"
    );
    assert_eq!(acquire().await.unwrap().status(), 429);
    let len: usize = conn.hlen(prefixed_hash).unwrap();
    assert_eq!(len, 2, "counted in the prefixed hash, with Dify's entry");
    let unprefixed: usize = conn.exists(HASH).unwrap();
    assert_eq!(unprefixed, 0, "nothing in the unprefixed hash");
    // Dify's exit (HDEL through the wrapper) frees the slot for inflight.
    let _: () = conn.hdel(prefixed_hash, "dify-req").unwrap();
    assert_eq!(acquire().await.unwrap().status(), 201);
    let set = client
        .put(format!("{base}/v1/keys/app-1/limit"))
        .json(&json!({"limit": 4}))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), 200);
    let written: String = conn.get(limit_key).unwrap();
    assert_eq!(written, "4");
    let unprefixed: Option<String> = conn
        .get("dify:rate_limit:app-1:max_active_requests")
        .unwrap();
    assert_eq!(unprefixed, None);
}

/// A ceiling alone is enough for `--layout dify` (dify.lua gives a cold app the ceiling, as Dify's own
/// settings would give it `APP_MAX_ACTIVE_REQUESTS`); neither is refused, naming both variables.
#[tokio::test]
async fn layout_dify_starts_with_a_ceiling_alone_and_a_cold_app_gets_it() {
    let redis = TestRedis::start();
    let url = redis.url();
    let args = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--store",
        &url,
        "--layout",
        "dify",
    ];
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inflight"))
        .args(args)
        .env_clear()
        .output()
        .unwrap();
    assert!(!out.status.success());
    let refused = String::from_utf8_lossy(&out.stderr);
    assert!(
        refused.contains("APP_DEFAULT_ACTIVE_REQUESTS")
            && refused.contains("APP_MAX_ACTIVE_REQUESTS")
            && !refused.contains("   "),
        "{refused}"
    );
    let (_server, started) = Running::start_with_env(&args, &[("APP_MAX_ACTIVE_REQUESTS", "2")]);
    let base = format!("http://{}", listen_of(&started));
    let client = reqwest::Client::new();
    let acquire = || {
        client
            .post(format!("{base}/v1/keys/cold-app/permits"))
            .json(&json!({}))
            .send()
    };
    assert_eq!(acquire().await.unwrap().status(), 201);
    assert_eq!(acquire().await.unwrap().status(), 201);
    assert_eq!(acquire().await.unwrap().status(), 429, "the ceiling holds");
}

/// Dify's compose ships Redis 6.2 (`redis:6-alpine`), the oldest inflight supports: an older one stops
/// `serve` at start, with the reason, before any script reaches it.
#[test]
fn a_redis_older_than_the_oldest_supported_stops_the_start_with_the_reason() {
    let (port, seen) = test_support::old_redis("6.0.9");
    let url = format!("redis://127.0.0.1:{port}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inflight"))
        .args(["serve", "--listen", "127.0.0.1:0", "--store", &url])
        .args(["--default-limit", "2"])
        .env_clear()
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{log}");
    assert!(
        log.contains(
            "the store refused: Redis 6.0.9 is older than 6.2, the oldest inflight supports"
        ),
        "{log}"
    );
    let seen = seen.lock().unwrap().clone();
    assert!(!seen.iter().any(|c| c.starts_with("EVAL")), "{seen:?}");
}
