//! # inflight-tower
//!
//! [inflight](https://docs.rs/inflight)'s per-key in-flight limits for any tower service (axum, hyper,
//! tonic): [`InflightLayer`] takes a permit per request under a key of your choosing and holds it in the
//! response body ([`PermitBody`]) until the body ends or the client goes away; refusals are the JSON
//! answers of [`rejection`].
//!
//! ```
//! use axum::{routing::get, Router};
//! use inflight::{Limiter, MemoryStore, Policy};
//! use inflight_tower::InflightLayer;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let limiter = Limiter::builder(MemoryStore::new()).policy(Policy::new(4, 0)).build();
//! let by_tenant = |parts: &http::request::Parts| {
//!     parts.headers.get("x-tenant")?.to_str().ok().map(str::to_owned)
//! };
//! let app: Router = Router::new()
//!     .route("/v1/chat", get(|| async { "streamed answer" }))
//!     .layer(InflightLayer::new(limiter, by_tenant));
//! # let _ = app;
//! # }
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod body;
mod layer;
pub mod rejection;

pub use body::PermitBody;
pub use layer::{InflightLayer, InflightService, LimitedBody};
