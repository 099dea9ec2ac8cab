//! What a worker answers with: the API, or the proxy with the API under `/_inflight`.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use axum::response::Response;
use axum::Router;
use futures_util::future::Either;
use futures_util::FutureExt;
use tower_service::Service;

use crate::api;
use crate::app::App;
use crate::incoming::RequestBody;
use crate::proxy::{Peer, Proxy, Upstream};
use crate::status;

/// What a worker answers with; a proxy forwards everything outside `/_inflight` past axum's router.
#[derive(Clone)]
pub(super) struct Routes {
    api: Router,
    proxy: Option<Arc<Proxy>>,
}

impl Routes {
    /// The API and the status page at the root (their streams end when `stopping` turns true); or with
    /// an upstream, the API under `/_inflight` and everything else forwarded.
    pub(super) fn new(
        app: &Arc<App>,
        upstream: Option<&Upstream>,
        stopping: &tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        match upstream {
            None => Self {
                api: api::router(app.clone()).merge(status::router(&app.status, stopping.clone())),
                proxy: None,
            },
            Some(upstream) => {
                let api = match upstream.api_on_proxy_port {
                    true => Router::new().nest_service(API_PREFIX, api::router(app.clone())),
                    false => {
                        Router::new().nest_service(API_PREFIX, Router::new().fallback(elsewhere))
                    }
                };
                Self {
                    api,
                    proxy: Some(Arc::new(Proxy::new(app.clone(), upstream.clone()))),
                }
            }
        }
    }

    /// What a connection past the cap is answered: health checks only.
    pub(super) fn health(app: &Arc<App>) -> Self {
        Self {
            api: api::health_router(app.clone()),
            proxy: None,
        }
    }

    pub(super) fn respond(
        &self,
        request: http::Request<RequestBody>,
        client: &Peer,
    ) -> impl Future<Output = Result<Response, Infallible>> + Send + 'static {
        match &self.proxy {
            Some(proxy) if !is_api(request.uri().path()) => {
                Either::Left(proxy.clone().forward(request, client.clone()).map(Ok))
            }
            _ => Either::Right(self.api.clone().call(request)),
        }
    }
}

/// `/_inflight` on the proxied port, when the API answers on the admin listener only.
async fn elsewhere() -> crate::error::ApiError {
    crate::error::ApiError::new(
        http::StatusCode::NOT_FOUND,
        "not_found",
        "The API is not served on this port (see --admin-listen).",
    )
}

/// Where a proxy answers with its API: the prefix itself, or the prefix and a `/` (as `nest_service`).
const API_PREFIX: &str = "/_inflight";

fn is_api(path: &str) -> bool {
    path.strip_prefix(API_PREFIX)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::is_api;

    #[test]
    fn the_api_prefix_is_a_whole_path_segment() {
        for path in ["/_inflight", "/_inflight/", "/_inflight/v1/keys/k"] {
            assert!(is_api(path), "{path}");
        }
        for path in [
            "/",
            "/_inflightx",
            "/_inflight_v1",
            "/v1/_inflight",
            "/_INFLIGHT/metrics",
        ] {
            assert!(!is_api(path), "{path}");
        }
    }
}
