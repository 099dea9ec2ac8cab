//! In-process servers on port-0 listeners, an upstream to proxy to (upstream.rs), and stores to run
//! them on.
#![allow(dead_code, unreachable_pub, missing_docs)]

pub mod browser;
pub mod process;
pub mod raw;
mod upstream;

// Not every test binary proxies to an upstream.
#[allow(unused_imports)]
pub use upstream::{Refusing, Upstream};

use std::sync::Arc;
use std::time::{Duration, Instant};

use inflight::{BusyKeys, QuotaStore, Wakeups};
use inflight_server::config::Layered;
use inflight_server::{proxy, server, ProxySettings, Settings};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use test_support::TestRedis;

use inflight::{MemoryStore, RedisStore};

/// Each worker's store: one state, shared by every worker (and by the test).
pub type Stores<S> = Arc<dyn Fn() -> S + Send + Sync>;

/// A running server.
pub struct Server<S: Wakeups> {
    pub base: String,
    stores: Stores<S>,
    policy: inflight::Policy,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl<S: Wakeups> Server<S> {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Signals shutdown (as SIGTERM would) and waits for the server to finish.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        self.signal();
        self.finished().await
    }

    pub fn signal(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    pub async fn finished(&mut self) -> std::io::Result<()> {
        match self.task.take() {
            Some(task) => task.await.expect("server task"),
            None => Ok(()),
        }
    }

    /// The key's in-flight count, as the store has it (also once the server has finished).
    pub async fn in_flight(&self, key: &str) -> u32 {
        let store = (self.stores)();
        let (limits, keep) = (
            self.policy.limits(key),
            inflight::store::OverrideChange::Keep,
        );
        store.status(key, limits, keep).await.unwrap().in_flight
    }
}

impl<S: Wakeups> Drop for Server<S> {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// Workers of a test server unless a test says otherwise: more than one, whatever the machine's cores.
const TEST_WORKERS: usize = 2;

/// Settings as `inflight serve` would read them from these limits (and no file).
pub fn limits(default_limit: u32, max_limit: u32) -> Settings {
    let (default_limit, max_limit) = (default_limit.to_string(), max_limit.to_string());
    let flags = [
        "inflight",
        "--default-limit",
        &default_limit,
        "--max-limit",
        &max_limit,
    ];
    let mut settings = Settings::from_flags(flags).expect("valid test settings");
    settings.workers = settings.workers.or(Some(TEST_WORKERS));
    settings
}

/// The settings of a proxy to `upstream` with `serve`'s settings.
pub fn proxy_settings(upstream: &str, serve: Settings) -> ProxySettings {
    let flags = [
        "inflight",
        "--upstream",
        upstream,
        "--upstream-timeout",
        "2s",
    ];
    let mut settings = ProxySettings::from_flags(flags).expect("valid test settings");
    settings.serve = serve;
    // In-process test servers serve the API under /_inflight on the proxied port, as they always did;
    // the admin listener is tested with the binary.
    settings.admin_on_proxy_port = true;
    settings
}

async fn start<S: Wakeups + Into<inflight::AnyStore>>(
    settings: &Settings,
    stores: Stores<S>,
    upstream: Option<proxy::Upstream>,
) -> Server<S> {
    let listeners = server::bind("127.0.0.1:0".parse().unwrap(), settings.workers()).unwrap();
    let base = format!("http://{}", listeners[0].local_addr().unwrap());
    let app = {
        let (settings, stores) = (settings.clone(), stores.clone());
        let shared = inflight_server::Shared::new(&settings).expect("valid limits");
        move || Ok(inflight_server::app(&settings, &shared, stores().into())?)
    };
    let workers = server::Workers::start(listeners, app, upstream, settings.into(), None)
        .await
        .expect("the workers start");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(workers.run(async {
        let _ = stopped.await;
    }));
    Server {
        base,
        stores,
        policy: settings.policy().expect("valid limits"),
        stop: Some(stop),
        task: Some(task),
    }
}

pub async fn start_api<S: Wakeups + Into<inflight::AnyStore>>(
    settings: &Settings,
    stores: Stores<S>,
) -> Server<S> {
    start(settings, stores, None).await
}

pub async fn start_proxy<S: Wakeups + Into<inflight::AnyStore>>(
    settings: &ProxySettings,
    stores: Stores<S>,
) -> Server<S> {
    let upstream = inflight_server::upstream(settings).expect("valid test settings");
    start(&settings.serve, stores, Some(upstream)).await
}

/// The status of a request's answer.
pub async fn status_of(request: reqwest::RequestBuilder) -> reqwest::StatusCode {
    request.send().await.unwrap().status()
}

/// `GET url` as JSON.
pub async fn get_json(client: &reqwest::Client, url: impl reqwest::IntoUrl) -> serde_json::Value {
    client.get(url).send().await.unwrap().json().await.unwrap()
}

/// GET `url` and its body as text (the metrics page, say).
pub async fn get_text(client: &reqwest::Client, url: impl reqwest::IntoUrl) -> String {
    client.get(url).send().await.unwrap().text().await.unwrap()
}

/// The value of the series `name` (with its labels, if any) on the metrics page at `url`; 0 when the page
/// does not have it yet.
pub async fn metric(client: &reqwest::Client, url: &str, name: &str) -> f64 {
    let text = get_text(client, url).await;
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// The sum of the series of `name` whose labels include `label` (e.g. `class="k"`), 0 when none.
pub async fn metric_sum(client: &reqwest::Client, url: &str, name: &str, label: &str) -> f64 {
    let text = get_text(client, url).await;
    text.lines()
        .filter_map(|line| line.strip_prefix(name)?.strip_prefix('{'))
        .filter_map(|rest| rest.split_once("} "))
        .filter(|(labels, _)| labels.split(',').any(|one| one == label))
        .filter_map(|(_, value)| value.parse::<f64>().ok())
        .sum()
}

/// Polls `GET {base}{prefix}/v1/keys/{key}` until its in_flight is `want`; panics after 2 s.
pub async fn wait_in_flight(base: &str, key: &str, want: u64) -> Duration {
    let started = Instant::now();
    let client = reqwest::Client::new();
    loop {
        let body = get_json(&client, format!("{base}/v1/keys/{key}")).await;
        if body["in_flight"] == want {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "in_flight of {key} stayed {body}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A store per test: the memory store, or a fresh redis-server's.
pub trait Make {
    type S: Wakeups + QuotaStore + BusyKeys + Into<inflight::AnyStore>;
    fn stores(redis: &Option<TestRedis>) -> Stores<Self::S>;
    fn redis() -> Option<TestRedis>;
}

pub struct Memory;
impl Make for Memory {
    type S = MemoryStore;
    /// One embedded store, shared by every worker's limiter.
    fn stores(_: &Option<TestRedis>) -> Stores<MemoryStore> {
        let store = MemoryStore::new();
        Arc::new(move || store.clone())
    }
    fn redis() -> Option<TestRedis> {
        None
    }
}

pub struct Redis;
impl Make for Redis {
    type S = RedisStore;
    fn stores(redis: &Option<TestRedis>) -> Stores<RedisStore> {
        redis_stores(redis.as_ref().expect("a redis"))
    }
    fn redis() -> Option<TestRedis> {
        Some(TestRedis::start())
    }
}

/// As the `inflight` binary opens them: a store of its own for each worker, opened in its runtime.
pub fn redis_stores(redis: &TestRedis) -> Stores<RedisStore> {
    let url = redis.url();
    Arc::new(move || {
        RedisStore::builder(url.clone())
            .response_timeout(Duration::from_millis(500))
            .connection_timeout(Duration::from_millis(200))
            .open()
            .expect("test redis url")
    })
}

/// Instantiates each scenario as a test on the memory store and on a fresh redis-server.
#[macro_export]
macro_rules! per_store {
    ($($name:ident),* $(,)?) => {
        mod memory { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name::<$crate::common::Memory>().await } )* }
        mod redis { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name::<$crate::common::Redis>().await } )* }
    };
}
