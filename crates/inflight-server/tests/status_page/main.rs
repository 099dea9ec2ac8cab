//! The live status page: `/status` and `/status/events` over HTTP, and the page itself in a real
//! headless Chromium (Debian's `chromium`): it renders, shows a key that holds permits, and follows
//! its release; a click on a key lists its holders and waiters, which it can revoke.
//!
//! By theme: `/status` and `/status/events` over HTTP (events.rs), the page in Chromium (chromium.rs),
//! and its key view, clicked in Chromium (holders.rs).
#![allow(missing_docs)]

mod chromium;
#[path = "../common/mod.rs"]
mod common;
mod events;
mod holders;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

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
