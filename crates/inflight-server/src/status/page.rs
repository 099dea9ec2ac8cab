//! The two routes: `/status`, the page, and `/status/events`, its stream; and who may see them.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures_util::StreamExt;
use tokio::sync::watch;

use super::board::{Board, MAX_CLIENTS};
use super::sampler;
use crate::auth::Tokens;
use crate::error::ApiError;

/// The page.
pub const PAGE: &str = include_str!("page.html");

/// The state of the two routes.
#[derive(Clone)]
struct Page {
    board: Arc<Board>,
    stopping: watch::Receiver<bool>,
}

/// `/status` and `/status/events` of `board`, whose streams end when `stopping` turns true; starts the
/// worker's sampling task (once per board) on the current runtime.
pub fn router(board: &Arc<Board>, stopping: watch::Receiver<bool>) -> Router {
    if !board.started.swap(true, Ordering::SeqCst) {
        tokio::spawn(sampler::run(Arc::downgrade(board), stopping.clone()));
    }
    let page = Page {
        board: board.clone(),
        stopping,
    };
    Router::new()
        .route("/status", get(page_html))
        .route("/status/events", get(events))
        .route_layer(axum::middleware::map_response(private))
        .with_state(page)
}

/// The headers of both routes: never cached, no referrer (the URL may carry the token).
async fn private(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    response
}

async fn page_html(
    State(page): State<Page>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, ApiError> {
    allowed(&page.board.tokens, &headers, &uri)?;
    let mut response = ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE).into_response();
    response.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; \
             connect-src 'self'; img-src data:; frame-ancestors 'none'",
        ),
    );
    Ok(response)
}

/// How long a page waits before it opens its next stream once one ends.
const RECONNECT: std::time::Duration = std::time::Duration::from_millis(250);

async fn events(
    State(page): State<Page>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, ApiError> {
    allowed(&page.board.tokens, &headers, &uri)?;
    let board = &page.board;
    let Ok(watching) = board.clients.clone().try_acquire_owned() else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_status_clients",
            format!("{MAX_CLIENTS} pages watch this worker's status already: retry later."),
        ));
    };
    let snapshots = board.snapshot.subscribe();
    board.wake.notify_one();
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
    // The stream ends at its lifetime (the page's EventSource reconnects after the `retry` sent first),
    // so that a watcher that reads nothing (TCP tells nothing of it until buffers fill) gives its place
    // back; or when the server begins to shut down.
    let retry = futures_util::stream::once(async {
        Ok::<_, Infallible>(Event::default().retry(RECONNECT).comment("reconnect"))
    });
    let mut stopping = page.stopping.clone();
    let lifetime = board.stream_lifetime;
    let stream = retry.chain(stream).take_until(async move {
        let _ = tokio::time::timeout(lifetime, stopping.wait_for(|stop| *stop)).await;
    });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// Whether the request carries the token these routes need (see the module's docs).
fn allowed(tokens: &Tokens, headers: &HeaderMap, uri: &Uri) -> Result<(), ApiError> {
    let query = crate::api::query(uri).unwrap_or_default();
    let token = query.iter().find(|(name, _)| name == "token");
    let token = token.map(|(_, token)| token.as_str());
    if tokens.may_see_status(headers.get(header::AUTHORIZATION), token) {
        return Ok(());
    }
    Err(ApiError::unauthorized(
        "The status page needs the admin token (or, without one, the API token): \
         open /status?token=TOKEN, or send Authorization: Bearer TOKEN.",
    ))
}
