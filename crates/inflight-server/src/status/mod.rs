//! The live status page: `GET /status` (one self-contained HTML page, `page.html`) and
//! `GET /status/events` (server-sent events, one a second while a page watches: the busiest keys, the
//! figures of the last minute, the store's health and latency). A click on a key lists its holders and
//! waiters, with a button to revoke each, from the API's admin routes (`GET /v1/keys/{key}/permits` and
//! the two `DELETE`s), which the page sends the token it was opened with (`?token=`); refused, it says
//! that they need the admin token.
//!
//! Served where the API is served plainly: `serve`'s listener, and the proxy's `--admin-listen` one.
//! Each worker has its own board: admissions and refusals are the whole server's, reclaimed leases and
//! waiters the worker's own limiter's. At most [`MAX_CLIENTS`] pages watch one worker at once (one
//! more: 503); each stream ends after `--status-stream-lifetime` (the page reconnects), so that a
//! watcher that reads nothing gives its place back; every stream ends when the server begins to shut
//! down.
//!
//! Access: with an admin token set, both routes need it; else with an API token, that one; else they
//! are open. An `EventSource` cannot send a header, so the token is also taken from `?token=` on these
//! two routes only (then it is in the page's URL and what logs it). Answers are never cached and send
//! no referrer.

mod board;
mod page;
mod ring;
mod sampler;

pub use board::{Board, MAX_CLIENTS};
pub use page::{router, PAGE};
