//! The live status page: `GET /status` (one self-contained HTML page, `page.html`) and
//! `GET /status/events` (server-sent events, one a second while a page watches: the busiest keys, the
//! figures of the last minute, the store's health and latency).
//!
//! Served where the API is served plainly: `serve`'s listener, and the proxy's `--admin-listen` one.
//! Each worker has its own board: admissions and refusals are the whole server's, reclaimed leases and
//! waiters the worker's own limiter's. At most [`MAX_CLIENTS`] pages watch one worker at once (one
//! more: 503); every stream ends when the server begins to shut down.
//!
//! Access: with an admin token set, both routes need it; else with an API token, that one; else they
//! are open. A browser cannot send a header on an `EventSource`, so besides `Authorization: Bearer` the
//! token is taken from `?token=` on these two routes only (the page passes its own on): the token is
//! then in the page's URL (the browser's history, a fronting proxy's access log). Answers are never
//! cached and send no referrer.

mod ring;
mod sampler;

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures_util::StreamExt;
use inflight::{AnyStore, Limiter};
use tokio::sync::{watch, Notify, Semaphore};

use crate::auth::{bearer_token, constant_time_eq, Tokens};
use crate::error::ApiError;
use crate::metrics::Metrics;

pub use sampler::PAGE_KEYS;

/// The page.
pub const PAGE: &str = include_str!("page.html");

/// The most pages that may watch one worker's events at once.
pub const MAX_CLIENTS: usize = 32;

/// One worker's status page: what it shows (read from the worker's limiter and the server's metrics),
/// who may see it, its watchers, the last minute of its counters.
#[derive(Clone)]
pub struct Board {
    inner: Arc<Inner>,
}

struct Inner {
    limiter: Limiter<AnyStore>,
    metrics: Metrics,
    tokens: Tokens,
    clients: Arc<Semaphore>,
    ring: Mutex<ring::Ring>,
    /// The JSON the pages show now ("" before the first).
    snapshot: watch::Sender<Arc<str>>,
    /// A new page: publish at once rather than at the next second.
    wake: Arc<Notify>,
    started: AtomicBool,
}

impl Board {
    /// The board of a worker with this limiter, the server's metrics, and these tokens.
    pub fn new(limiter: Limiter<AnyStore>, metrics: Metrics, tokens: Tokens) -> Self {
        Self {
            inner: Arc::new(Inner {
                limiter,
                metrics,
                tokens,
                clients: Arc::new(Semaphore::new(MAX_CLIENTS)),
                ring: Mutex::default(),
                snapshot: watch::Sender::new(Arc::from("")),
                wake: Arc::default(),
                started: AtomicBool::new(false),
            }),
        }
    }

    /// How many pages watch the events now.
    pub fn clients(&self) -> usize {
        MAX_CLIENTS - self.inner.clients.available_permits()
    }

    /// The JSON the pages are shown now (empty before the first update).
    pub fn snapshot(&self) -> Arc<str> {
        self.inner.snapshot.borrow().clone()
    }
}

impl Inner {
    fn ring(&self) -> MutexGuard<'_, ring::Ring> {
        self.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The state of the two routes.
#[derive(Clone)]
struct Page {
    board: Board,
    stopping: watch::Receiver<bool>,
}

/// `/status` and `/status/events` of `board`, whose streams end when `stopping` turns true; starts the
/// worker's sampling task (once per board) on the current runtime.
pub fn router(board: &Board, stopping: watch::Receiver<bool>) -> Router {
    if !board.inner.started.swap(true, Ordering::SeqCst) {
        tokio::spawn(sampler::run(Arc::downgrade(&board.inner), stopping.clone()));
    }
    let page = Page {
        board: board.clone(),
        stopping,
    };
    Router::new()
        .route("/status", get(page_html))
        .route("/status/events", get(events))
        .with_state(page)
}

/// The headers of both routes: never cached, no referrer (the URL may carry the token).
fn private(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    response
}

async fn page_html(State(page): State<Page>, headers: HeaderMap, uri: Uri) -> Response {
    if let Err(refused) = allowed(&page.board.inner.tokens, &headers, &uri) {
        return private(refused.into_response());
    }
    let mut response = ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE).into_response();
    response.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; \
             connect-src 'self'; img-src data:; frame-ancestors 'none'",
        ),
    );
    private(response)
}

async fn events(State(page): State<Page>, headers: HeaderMap, uri: Uri) -> Response {
    if let Err(refused) = allowed(&page.board.inner.tokens, &headers, &uri) {
        return private(refused.into_response());
    }
    let board = &page.board;
    let Ok(watching) = board.inner.clients.clone().try_acquire_owned() else {
        return private(
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "too_many_status_clients",
                format!("{MAX_CLIENTS} pages watch this worker's status already: retry later."),
            )
            .into_response(),
        );
    };
    let snapshots = board.inner.snapshot.subscribe();
    board.inner.wake.notify_one();
    // Each new snapshot, from the one the wake-up above makes (an older one may be stale); the place
    // among the watchers is held as long as the stream.
    let stream = futures_util::stream::unfold(
        (snapshots, watching),
        |(mut snapshots, watching)| async move {
            snapshots.changed().await.ok()?;
            let json = snapshots.borrow_and_update().clone();
            let event = Event::default().data(&*json);
            Some((Ok::<_, Infallible>(event), (snapshots, watching)))
        },
    );
    let mut stopping = page.stopping.clone();
    let stream = stream.take_until(async move {
        let _ = stopping.wait_for(|stop| *stop).await;
    });
    private(
        Sse::new(stream)
            .keep_alive(KeepAlive::default())
            .into_response(),
    )
}

/// Whether the request carries the token these routes need (see the module's docs).
fn allowed(tokens: &Tokens, headers: &HeaderMap, uri: &Uri) -> Result<(), ApiError> {
    let Some(needed) = tokens.status_page() else {
        return Ok(());
    };
    let from_header = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(bearer_token)
        .map(str::to_owned);
    let from_query = crate::api::query(uri)
        .unwrap_or_default()
        .into_iter()
        .find(|(name, _)| name == "token")
        .map(|(_, token)| token);
    let given = [from_header, from_query];
    if given
        .iter()
        .flatten()
        .any(|token| constant_time_eq(token.as_bytes(), needed.as_bytes()))
    {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "The status page needs the admin token (or, without one, the API token): \
         open /status?token=TOKEN, or send Authorization: Bearer TOKEN.",
    ))
}
