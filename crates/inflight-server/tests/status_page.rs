//! The live status page: `/status` and `/status/events` over HTTP, and the page itself in a real
//! headless Chromium (Debian's `chromium`): it renders, shows a key that holds permits, and follows
//! its release.
#![allow(missing_docs)]

mod common;

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use common::browser::{browse, chromium};
use common::{limits, start_api, Make, Memory};
use futures_util::StreamExt;
use inflight::MemoryStore;
use inflight_server::{server, App, Settings};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};
use tokio::sync::oneshot;

/// A one-worker server on the memory store whose app the test can see (its status board).
struct Served {
    base: String,
    app: Arc<OnceLock<Arc<App>>>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Served {
    async fn start(settings: Settings) -> Self {
        let mut settings = settings;
        settings.workers = Some(1);
        let listeners = server::bind("127.0.0.1:0".parse().unwrap(), 1).unwrap();
        let base = format!("http://{}", listeners[0].local_addr().unwrap());
        let seen: Arc<OnceLock<Arc<App>>> = Arc::default();
        let make = {
            let (settings, seen, store) = (settings.clone(), seen.clone(), MemoryStore::new());
            let shared = inflight_server::Shared::new(&settings).unwrap();
            move || {
                let app = inflight_server::app(&settings, &shared, store.clone().into())?;
                let _ = seen.set(app.clone());
                Ok(app)
            }
        };
        let workers = server::Workers::start(listeners, make, None, (&settings).into(), None)
            .await
            .unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(workers.run(async {
            let _ = stopped.await;
        }));
        Self {
            base,
            app: seen,
            stop: Some(stop),
            task,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn board(&self) -> &inflight_server::status::Board {
        &self.app.get().expect("the worker built its app").status
    }

    async fn shutdown(mut self) -> std::io::Result<()> {
        let _ = self.stop.take().map(|stop| stop.send(()));
        (&mut self.task).await.unwrap()
    }
}

async fn acquire(http: &Client, base: &str, key: &str, weight: u32) -> Value {
    let response = http
        .post(format!("{base}/v1/keys/{key}/permits"))
        .json(&json!({"weight": weight}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    response.json().await.unwrap()
}

async fn release(http: &Client, base: &str, key: &str, permit: &Value) {
    let id = permit["id"].as_str().unwrap();
    let response = http
        .delete(format!("{base}/v1/keys/{key}/permits/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
}

/// The next event's JSON from an event stream (bounded).
async fn next_event(
    stream: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    buffer: &mut String,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            if let Some(data) = event.lines().find_map(|line| line.strip_prefix("data: ")) {
                return serde_json::from_str(data).unwrap();
            }
            continue;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let chunk = tokio::time::timeout(left, stream.next())
            .await
            .expect("an event within 10 s")
            .expect("the stream goes on")
            .unwrap();
        buffer.push_str(std::str::from_utf8(&chunk).unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_self_contained_and_its_events_show_held_keys() {
    let redis = Memory::redis();
    let server = start_api(&limits(4, 0), Memory::stores(&redis)).await;
    let http = Client::new();
    let page = http.get(server.url("/status")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert_eq!(page.headers()["content-type"], "text/html; charset=utf-8");
    assert_eq!(page.headers()["cache-control"], "no-store");
    assert!(page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .contains("default-src 'none'"));
    let html = page.text().await.unwrap();
    assert!(html.contains("status/events") && html.contains("<style>"));
    // Nothing from elsewhere: no external script, style, font or image.
    for outside in ["http://", "https://", "src=", "@import", "url("] {
        assert!(!html.contains(outside), "the page refers to {outside}");
    }

    let permit = acquire(&http, &server.base, "app:held", 2).await;
    let events = http.get(server.url("/status/events")).send().await.unwrap();
    assert_eq!(events.status(), StatusCode::OK);
    assert_eq!(events.headers()["content-type"], "text/event-stream");
    let (mut stream, mut buffer) = (events.bytes_stream(), String::new());
    let first = next_event(&mut stream, &mut buffer).await;
    assert_eq!(
        first["keys"],
        json!([{"key": "app:held", "limit": 4, "in_flight": 2}])
    );
    assert_eq!(first["store"]["ok"], true);
    assert_eq!(first["store"]["listing"], true);
    assert!(first["store"]["latency_ms"].as_f64().unwrap() >= 0.0);
    assert!(first["per_minute"]["admitted"].as_u64().is_some());
    release(&http, &server.base, "app:held", &permit).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let event = next_event(&mut stream, &mut buffer).await;
        if event["keys"] == json!([]) {
            break;
        }
        assert!(Instant::now() < deadline, "still shown: {event}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_counted_per_minute() {
    let served = Served::start(limits(1, 0)).await;
    let http = Client::new();
    let _held = acquire(&http, &served.base, "k", 1).await;
    for _ in 0..3 {
        let refused = http
            .post(served.url("/v1/keys/k/permits"))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    }
    let events = http.get(served.url("/status/events")).send().await.unwrap();
    let (mut stream, mut buffer) = (events.bytes_stream(), String::new());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let event = next_event(&mut stream, &mut buffer).await;
        // (The counts of a second land in the ring at the next tick.)
        if event["per_minute"]["refused"] == 3 {
            assert_eq!(event["per_minute"]["admitted"], 1);
            break;
        }
        assert!(Instant::now() < deadline, "refusals not counted: {event}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_are_bounded_and_their_streams_end_at_shutdown() {
    let mut settings = limits(1, 0);
    settings.shutdown_grace = Duration::from_secs(30);
    let served = Served::start(settings).await;
    let http = Client::new();
    let mut streams = Vec::new();
    for _ in 0..inflight_server::status::MAX_CLIENTS {
        let events = http.get(served.url("/status/events")).send().await.unwrap();
        assert_eq!(events.status(), StatusCode::OK);
        streams.push(events);
    }
    assert_eq!(
        served.board().clients(),
        inflight_server::status::MAX_CLIENTS
    );
    let refused = http.get(served.url("/status/events")).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "too_many_status_clients");
    assert_eq!(body["status"], 503);
    // One goes away: its place is free again.
    drop(streams.pop());
    let started = Instant::now();
    let again = loop {
        let events = http.get(served.url("/status/events")).send().await.unwrap();
        if events.status() == StatusCode::OK {
            break events;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the place stayed taken"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut stream = again.bytes_stream();
    let started = Instant::now();
    // Every stream ends when shutdown begins, not when the grace period (30 s) is over.
    served.shutdown().await.expect("no stream was cut");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("the stream ended")
    {
        if chunk.is_err() {
            break;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_admin_token_the_page_and_its_events_need_it() {
    let settings = Settings {
        admin_token: Some("adm-s3cret".into()),
        api_token: Some("api-s3cret".into()),
        ..limits(1, 0)
    };
    let served = Served::start(settings).await;
    let http = Client::new();
    for path in ["/status", "/status/events"] {
        for refused in [
            http.get(served.url(path)),
            http.get(served.url(&format!("{path}?token=wrong"))),
            http.get(served.url(&format!("{path}?token=api-s3cret"))),
            http.get(served.url(path)).bearer_auth("api-s3cret"),
        ] {
            let response = refused.send().await.unwrap();
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{path}");
            assert_eq!(response.headers()["cache-control"], "no-store");
            let body: Value = response.json().await.unwrap();
            assert_eq!(body["code"], "unauthorized");
        }
        for allowed in [
            http.get(served.url(&format!("{path}?token=adm-s3cret"))),
            http.get(served.url(&format!("{path}?events=1&token=adm%2Ds3cret"))),
            http.get(served.url(path)).bearer_auth("adm-s3cret"),
        ] {
            let response = allowed.send().await.unwrap();
            assert_eq!(response.status(), StatusCode::OK, "{path}");
            assert_eq!(response.headers()["referrer-policy"], "no-referrer");
        }
    }
    served.shutdown().await.unwrap();
}

// --- In a real browser (common/browser.rs) ---

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

/// `inflight proxy`: the page is on the admin listener, not on the proxied port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_serves_the_page_on_its_admin_listener_only() {
    use common::process::{admin_of, listen_of, Running};
    let upstream = common::Upstream::start().await;
    let (_server, started) = Running::start(&common::process::proxy_args(
        &upstream.base,
        &["--default-limit", "8"],
    ));
    let (base, admin) = (
        format!("http://{}", listen_of(&started)),
        format!("http://{}", admin_of(&started)),
    );
    let http = Client::new();
    let page = http.get(format!("{admin}/status")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.text().await.unwrap().contains("status/events"));
    let events = http
        .get(format!("{admin}/status/events"))
        .send()
        .await
        .unwrap();
    assert_eq!(events.headers()["content-type"], "text/event-stream");
    let (mut stream, mut buffer) = (events.bytes_stream(), String::new());
    let event = next_event(&mut stream, &mut buffer).await;
    assert_eq!(event["store"]["ok"], true);
    // On the proxied port /status is a path like any other (here refused: it has no key).
    let proxied = http.get(format!("{base}/status")).send().await.unwrap();
    let (status, body) = (proxied.status(), proxied.text().await.unwrap());
    assert!(
        !body.contains("status/events"),
        "the page on the proxied port"
    );
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("missing_key"), "{body}");
}
