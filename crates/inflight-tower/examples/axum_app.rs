//! An axum app whose chat endpoint streams its answer, limited to 2 answers in flight per tenant with
//! inflight-tower. Each answer holds its tenant's slot until its last chunk is sent or the client leaves.
//!
//! ```sh
//! cargo run -p inflight-tower --example axum_app
//! curl -N -H 'x-tenant: acme' localhost:3000/chat   # three at once: the third gets 429
//! ```

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::routing::get;
use axum::Router;
use inflight::{Limiter, MemoryStore, Policy};
use inflight_tower::InflightLayer;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let limiter = Limiter::builder(MemoryStore::new())
        .policy(Policy::new(2, 0))
        .build();
    let tenant = |parts: &http::request::Parts| {
        parts
            .headers
            .get("x-tenant")?
            .to_str()
            .ok()
            .map(str::to_owned)
    };
    let app = Router::new()
        .route("/chat", get(chat))
        .layer(InflightLayer::new(limiter, tenant));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}/chat", listener.local_addr()?);
    axum::serve(listener, app).await
}

/// A slow streamed answer, as an LLM's would be.
async fn chat() -> Body {
    let words = [
        "inflight ",
        "holds ",
        "this ",
        "slot ",
        "until ",
        "the ",
        "end.\n",
    ];
    let stream = futures_util::stream::unfold(0, move |n| async move {
        if n == words.len() {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        Some((
            Ok::<_, Infallible>(Bytes::from_static(words[n].as_bytes())),
            n + 1,
        ))
    });
    Body::from_stream(stream)
}
