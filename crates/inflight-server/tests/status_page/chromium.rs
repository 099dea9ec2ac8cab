//! The page in a real headless Chromium (common/browser.rs): it renders a held key and follows its
//! release.

use std::path::Path;
use std::time::{Duration, Instant};

use inflight_server::Settings;
use reqwest::{Client, StatusCode};
use serde_json::Value;

use crate::common::browser::{browse, chromium};
use crate::common::limits;
use crate::{acquire, release, Served};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_renders_a_held_key_and_its_release_and_a_screenshot() {
    let Some(chromium) = chromium() else { return };
    let served = Served::start(limits(4, 0)).await;
    let http = Client::new();
    let permit = acquire(&http, &served.base, "app:held", 3).await;

    let dom = browse(&chromium, &["--dump-dom"], served.url("/status?events=1")).await;
    assert!(
        dom.contains(r#"data-events="1""#),
        "the page got no update: {dom}"
    );
    assert!(
        dom.contains(r#"data-key="app:held" data-in-flight="3" data-limit="4""#),
        "the held key is not shown: {dom}"
    );
    assert!(dom.contains("3 / 4"), "{dom}");
    assert!(dom.contains(r#"id="store-text">ok<"#), "{dom}");

    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    let _ = std::fs::remove_file(&target);
    let shot = format!("--screenshot={}", target.display());
    browse(
        &chromium,
        &[&shot, "--window-size=1200,800", "--hide-scrollbars"],
        served.url("/status?events=1"),
    )
    .await;
    let png = std::fs::read(&target).expect("a screenshot was written");
    assert!(png.len() > 1000, "{} bytes", png.len());
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "a PNG");

    release(&http, &served.base, "app:held", &permit).await;
    let dom = browse(&chromium, &["--dump-dom"], served.url("/status?events=1")).await;
    assert!(dom.contains(r#"data-events="1""#), "{dom}");
    assert!(
        !dom.contains(r#"data-key="app:held""#),
        "still shown: {dom}"
    );
    assert!(
        dom.contains(r#"<div id="empty" style="display: block;">"#),
        "{dom}"
    );
    served.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_follows_a_release_in_one_page() {
    let Some(chromium) = chromium() else { return };
    let settings = Settings {
        admin_token: Some("adm-s3cret".into()),
        ..limits(4, 0)
    };
    let served = Served::start(settings).await;
    let http = Client::new();
    let permit = {
        let response = http
            .post(served.url("/v1/keys/app:held/permits"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
        response.json::<Value>().await.unwrap()
    };
    // The page stops after 5 updates, one a second: held in the first ones, released in the last.
    let page = tokio::spawn(browse(
        &chromium,
        &["--dump-dom"],
        served.url("/status?events=5&token=adm-s3cret"),
    ));
    let started = Instant::now();
    while served.board().clients() == 0 || !served.board().snapshot().contains("app:held") {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the page never watched"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // (Let an update or two showing the held key reach the page.)
    tokio::time::sleep(Duration::from_millis(1200)).await;
    release(&http, &served.base, "app:held", &permit).await;
    let dom = page.await.unwrap();
    assert!(dom.contains(r#"data-events="5""#), "{dom}");
    let history: Vec<&str> = dom
        .split(r#"<ol id="history">"#)
        .nth(1)
        .and_then(|rest| rest.split("</ol>").next())
        .expect("the page's history")
        .split("<li>")
        .skip(1)
        .map(|li| li.trim_end_matches("</li>"))
        .collect();
    assert_eq!(history.len(), 5, "{history:?}");
    assert_eq!(history[0], "app:held=1", "{history:?}");
    assert_eq!(history[4], "", "the release is shown: {history:?}");
    assert!(!dom.contains(r#"data-key="app:held""#), "{dom}");
    served.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_shows_a_keys_waiters_by_priority_and_flow() {
    let Some(chromium) = chromium() else { return };
    let settings = Settings {
        workers: Some(1),
        ..limits(1, 0)
    };
    let served = Served::start(settings).await;
    let http = Client::new();
    let permit = acquire(&http, &served.base, "app:busy", 1).await;
    let body = serde_json::json!({"wait_ms": 60_000, "priority": 7, "flow": "acme"});
    let waiter = tokio::spawn(
        http.post(served.url("/v1/keys/app:busy/permits"))
            .json(&body)
            .send(),
    );
    let started = Instant::now();
    // Waiting, as the busy keys' listing shows it.
    loop {
        let listed = http.get(served.url("/v1/keys")).send().await.unwrap();
        if listed.text().await.unwrap().contains("acme") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "never waiting");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dom = browse(&chromium, &["--dump-dom"], served.url("/status?events=1")).await;
    assert!(
        dom.contains(r#"<div class="queued">p7 acme: 1</div>"#),
        "{dom}"
    );
    release(&http, &served.base, "app:busy", &permit).await;
    let admitted = waiter.await.unwrap().unwrap();
    assert_eq!(admitted.status(), StatusCode::CREATED);
    served.shutdown().await.unwrap();
}
