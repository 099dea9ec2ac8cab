//! What a worker answers with: the API, or the proxy with the API under `/_inflight`.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use axum::Router;
use futures_util::future::Either;
use futures_util::FutureExt;
use tower_service::Service;

use crate::api;
use crate::app::App;
use crate::error::ApiError;
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
                    true => api::router(app.clone()),
                    false => Router::new().fallback(elsewhere),
                };
                Self {
                    api: Router::new().nest_service(API_PREFIX, api),
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
        if let Some(refused) = unsupported_coding(request.headers()) {
            return Either::Left(std::future::ready(Ok(refused.into_response())));
        }
        Either::Right(match &self.proxy {
            Some(proxy) if !is_api(request.uri().path()) => {
                Either::Left(proxy.clone().forward(request, client.clone()).map(Ok))
            }
            _ => Either::Right(self.api.clone().call(request)),
        })
    }
}

/// `501 unsupported_transfer_coding` for a request body sent with a transfer coding other than
/// `chunked` (`Transfer-Encoding: gzip, chunked`): hyper reads the chunks and would pass the body on
/// still gzipped, its coding lost (RFC 9112 6.1: a coding the server does not know is answered 501).
fn unsupported_coding(headers: &http::HeaderMap) -> Option<ApiError> {
    let codings = headers.get_all(http::header::TRANSFER_ENCODING).iter();
    let codings = codings.flat_map(|value| value.as_bytes().split(|&b| b == b','));
    let other = codings
        .map(<[u8]>::trim_ascii)
        .find(|coding| !coding.is_empty() && !coding.eq_ignore_ascii_case(b"chunked"))?;
    let other = String::from_utf8_lossy(other);
    Some(ApiError::new(
        http::StatusCode::NOT_IMPLEMENTED,
        "unsupported_transfer_coding",
        format!("Transfer-Encoding {other:?} is not supported: send the body chunked only."),
    ))
}

/// `/_inflight` on the proxied port, when the API answers on the admin listener only.
async fn elsewhere() -> ApiError {
    ApiError::new(
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
    use super::{is_api, unsupported_coding};

    #[test]
    fn a_transfer_coding_other_than_chunked_is_refused() {
        for (codings, refused) in [
            (&["chunked"][..], false),
            (&["Chunked"], false),
            (&[], false),
            (&["gzip, chunked"], true),
            (&["gzip", "chunked"], true),
            (&["chunked, identity"], true),
            (&["chunked,"], false),
        ] {
            let mut headers = http::HeaderMap::new();
            for coding in codings {
                headers.append(http::header::TRANSFER_ENCODING, coding.parse().unwrap());
            }
            let answer = unsupported_coding(&headers).map(|e| e.status());
            assert_eq!(
                answer,
                refused.then_some(http::StatusCode::NOT_IMPLEMENTED),
                "{codings:?}"
            );
        }
    }

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
