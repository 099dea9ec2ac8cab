//! Shadow limits (`mode = "shadow"`, `--limit 'app:*=2,shadow'`): admitted past, counted exactly in
//! `inflight_shadow_refusals_total{class}`, logged; enforced from the next admission after a reload; in
//! real `inflight serve` processes, on the memory store and on one redis-server shared by two.
#![allow(missing_docs)]

mod common;

use std::time::{Duration, Instant};

use common::process::{listen_of, Running};
use common::{metric_sum, TestRedis};
use reqwest::{Client, StatusCode};

const SHADOWED: &str = "inflight_shadow_refusals_total";

async fn acquire(http: &Client, base: &str, key: &str) -> StatusCode {
    let url = format!("{base}/v1/keys/{key}/permits");
    http.post(url)
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test]
async fn a_shadow_rule_admits_past_its_limit_counts_the_excess_and_enforces_after_a_reload() {
    let dir = std::env::temp_dir().join(format!("inflight-shadow-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("inflight.toml");
    let write = |mode: &str| {
        let text = format!("[[limits]]\nkeys = \"app:*\"\ndefault = 2\nmode = \"{mode}\"\n");
        std::fs::write(&file, text).unwrap();
    };
    write("shadow");
    let config = file.to_str().unwrap().to_owned();
    let (mut server, started) =
        Running::start(&["serve", "--listen", "127.0.0.1:0", "--config", &config]);
    let base = format!("http://{}", listen_of(&started));
    let http = Client::new();
    for _ in 0..5 {
        assert_eq!(acquire(&http, &base, "app:a").await, StatusCode::CREATED);
    }
    let metrics = format!("{base}/metrics");
    let class = "class=\"app:*\"";
    assert_eq!(metric_sum(&http, &metrics, SHADOWED, class).await, 3.0);

    write("enforce");
    server.signal("-HUP");
    let deadline = Instant::now() + Duration::from_secs(5);
    while acquire(&http, &base, "app:a").await != StatusCode::TOO_MANY_REQUESTS {
        assert!(Instant::now() < deadline, "the rule was never enforced");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let counted = metric_sum(&http, &metrics, SHADOWED, class).await;
    assert!(
        (3.0..=4.0).contains(&counted),
        "{counted}: one more at most, before the reload applied"
    );
    server.signal("-TERM");
    assert!(server.wait_for(Duration::from_secs(10)).success());
    let log = server.rest_of_log().join("\n");
    assert!(log.contains("admitted past a shadow limit"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn two_servers_on_one_redis_count_the_excess_of_their_shared_shadow_limit() {
    let redis = TestRedis::start();
    let url = redis.url();
    let serve = || {
        let args = [
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            &url,
            "--limit",
            "app:*=2,shadow",
        ];
        let (server, started) = Running::start(&args);
        (server, format!("http://{}", listen_of(&started)))
    };
    let ((_one, one), (_two, two)) = (serve(), serve());
    let http = Client::new();
    for base in [&one, &two, &one, &two, &one] {
        assert_eq!(acquire(&http, base, "app:a").await, StatusCode::CREATED);
    }
    let class = "class=\"app:*\"";
    let one_counted = metric_sum(&http, &format!("{one}/metrics"), SHADOWED, class).await;
    let two_counted = metric_sum(&http, &format!("{two}/metrics"), SHADOWED, class).await;
    assert_eq!(
        one_counted + two_counted,
        3.0,
        "5 admitted under a shadow limit of 2"
    );
    let status: serde_json::Value = http
        .get(format!("{two}/v1/keys/app:a"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status["in_flight"], 5, "{status}");
}
