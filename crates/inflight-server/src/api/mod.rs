//! The HTTP limiter API, for workers in any language. The interface is a contract: see `openapi.json`.

use std::sync::Arc;

use axum::routing::{delete, get, post, put};
use axum::Router;

use crate::app::App;
use crate::auth::require_api_user;

mod holders;
mod input;
mod limits;
mod listing;
mod permits;
mod quotas;
mod service;

pub use input::{check_name, query, MAX_WAIT};
pub use listing::BusyJson;

/// The API's routes over `app`.
pub fn router(app: Arc<App>) -> Router {
    let v1 = Router::new()
        .route(
            "/v1/keys/{key}/permits",
            post(permits::acquire).get(holders::list),
        )
        .route(
            "/v1/keys/{key}/waiters/{ticket}",
            delete(holders::revoke_waiter),
        )
        .route("/v1/permits", post(permits::acquire_all))
        // One handler per verb: the key route names the permit's key, the id route finds its keys.
        .route(
            "/v1/keys/{key}/permits/{id}",
            put(permits::renew::<(String, String)>).delete(permits::release::<(String, String)>),
        )
        .route(
            "/v1/permits/{id}",
            put(permits::renew::<String>).delete(permits::release::<String>),
        )
        .route("/v1/keys", get(listing::list))
        .route("/v1/keys/{key}", get(limits::status))
        .route(
            "/v1/keys/{key}/limit",
            put(limits::set_limit).delete(limits::clear_limit),
        )
        .merge(quotas::routes())
        .route_layer(axum::middleware::from_fn_with_state(
            app.tokens.clone(),
            require_api_user,
        ));
    health_checks()
        .merge(v1)
        .route("/", get(service::index))
        .route("/openapi.json", get(service::openapi))
        .fallback(service::not_found)
        .method_not_allowed_fallback(service::method_not_allowed)
        .with_state(app)
}

/// What a connection past `serve`'s connection cap is answered (see `--max-connections`): health,
/// readiness and metrics; anything else `503 too_many_connections`.
pub fn health_router(app: Arc<App>) -> Router {
    health_checks()
        .fallback(service::too_many_connections)
        .with_state(app)
}

/// Health, readiness and metrics.
fn health_checks() -> Router<Arc<App>> {
    Router::new()
        .route("/healthz", get(service::healthz))
        .route("/readyz", get(service::readyz))
        .route("/metrics", get(service::metrics))
}
