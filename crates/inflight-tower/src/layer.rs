//! [`InflightLayer`]: per-key in-flight limits for any tower service.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response, StatusCode};
use http_body_util::{Either, Full};
use inflight::{Limiter, Store};
use tower_layer::Layer;
use tower_service::Service;

use crate::body::PermitBody;
use crate::rejection::{error_response, rejection, Refusing};

/// The body of a limited service's responses: the inner body holding its permit, or a JSON refusal.
pub type LimitedBody<B> = PermitBody<Either<B, Full<Bytes>>>;

/// Limits how many requests per key are in flight in the wrapped service; the key comes from each
/// request through a function of the caller's choosing (`None`: 400 `missing_key`).
///
/// The permit is taken before the inner service is called and held by the response body until it has
/// been sent or the client has gone away (tower's `ConcurrencyLimit` releases at the *headers*).
pub struct InflightLayer<S: Store, K> {
    limiter: Limiter<S>,
    key: Arc<K>,
}

impl<S: Store, K> InflightLayer<S, K>
where
    K: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    /// Limits per the key `key` finds in each request.
    pub fn new(limiter: Limiter<S>, key: K) -> Self {
        Self {
            limiter,
            key: Arc::new(key),
        }
    }
}

impl<S: Store, K> Clone for InflightLayer<S, K> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            key: self.key.clone(),
        }
    }
}

impl<S: Store, K, Inner> Layer<Inner> for InflightLayer<S, K> {
    type Service = InflightService<S, K, Inner>;

    fn layer(&self, inner: Inner) -> Self::Service {
        InflightService {
            layer: self.clone(),
            inner,
        }
    }
}

/// The service [`InflightLayer`] makes.
pub struct InflightService<S: Store, K, Inner> {
    layer: InflightLayer<S, K>,
    inner: Inner,
}

impl<S: Store, K, Inner: Clone> Clone for InflightService<S, K, Inner> {
    fn clone(&self) -> Self {
        Self {
            layer: self.layer.clone(),
            inner: self.inner.clone(),
        }
    }
}

impl<S, K, Inner, ReqBody, ResBody> Service<Request<ReqBody>> for InflightService<S, K, Inner>
where
    S: Store,
    K: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    Inner: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    Inner::Future: Send,
    ReqBody: Send + 'static,
{
    type Response = Response<LimitedBody<ResBody>>;
    type Error = Inner::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (parts, body) = request.into_parts();
        let key = (self.layer.key)(&parts);
        let request = Request::from_parts(parts, body);
        let limiter = self.layer.limiter.clone();
        // The clone that was made ready goes into the future; a fresh clone stays for the next call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let refused = |refusal: Response<Full<Bytes>>| {
                Ok(refusal.map(|b| PermitBody::new(Either::Right(b), None)))
            };
            let Some(key) = key else {
                let why = "The request names no key.";
                return refused(error_response(StatusCode::BAD_REQUEST, "missing_key", why));
            };
            let permit = match limiter.try_acquire(&key).await {
                Ok(permit) => permit,
                Err(error) => {
                    let policy = limiter.policy();
                    let class = policy.class_of(&key);
                    return refused(rejection(&error, Some(Refusing { key: &key, class })));
                }
            };
            let response = inner.call(request).await?;
            Ok(response.map(|b| PermitBody::new(Either::Left(b), Some(permit))))
        })
    }
}
