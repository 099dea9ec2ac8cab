//! The reverse proxy: admits each request under the keys its templates form (all at once, or none),
//! forwards it to the upstream, and holds the permit until the response body has been sent or the client
//! has gone away, or until the permit is revoked (`holder.rs`). Bodies stream both ways unbuffered
//! (server-sent events included). The API answers under `/_inflight/`. Each request is counted and logged
//! (`access.rs`).

mod access;
mod body;
mod forward;
mod headers;
mod holder;
mod lost;
mod paths;
mod pool;
mod sources;
mod standing;
mod templates;

use std::net::SocketAddr;
use std::time::Duration;

use http::{HeaderValue, Uri};

pub use forward::Proxy;
pub use holder::{HolderTemplate, OnRevoke};
pub use paths::LimitPaths;
pub use standing::StandingTemplates;
pub use templates::{KeyTemplates, OnMissingKey, MAX_KEYS};

/// Where and how to forward.
#[derive(Clone, Debug)]
pub struct Upstream {
    /// The upstream's base URL (`http://host:port[/base]`).
    pub base: Uri,
    /// The keys each limited request is admitted under.
    pub keys: KeyTemplates,
    /// What becomes of a request whose keys cannot be formed.
    pub on_missing_key: OnMissingKey,
    /// Which requests are limited (empty: all of them).
    pub limit_paths: LimitPaths,
    /// The priority and the flow each request waits with (`--priority`, `--flow`).
    pub queue: StandingTemplates,
    /// The label each limited request's permit is listed with (`--holder`).
    pub holder: HolderTemplate,
    /// What becomes of a response whose permit is revoked while it runs (`--on-revoke`).
    pub on_revoke: OnRevoke,
    /// The key each limited request is charged 1 to, if any (its template's one key).
    pub quota_key: Option<KeyTemplates>,
    /// How long a request may take upstream until its response headers (connecting and sending it included).
    pub timeout: Duration,
    /// How long a limited request may wait for a slot before it is refused (zero: not at all).
    pub max_wait: Duration,
    /// Whether the client's forwarding headers are trusted (appended to) or replaced.
    pub trust_forwarded: bool,
    /// Whether each admitted request's token goes upstream in `Inflight-Token`.
    pub forward_token: bool,
    /// Whether the API answers under `/_inflight` on the proxied port (else only on the admin listener).
    pub api_on_proxy_port: bool,
    /// Whether each request gets an access line (`--access-log`).
    pub access_log: bool,
}

/// The client at the other end of a connection: its address, written out once for `X-Forwarded-For`.
#[derive(Clone, Debug)]
pub struct Peer {
    /// The client's address.
    pub addr: SocketAddr,
    /// The client's IP address, as text.
    pub ip: HeaderValue,
}

impl Peer {
    /// The peer at `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        let ip = HeaderValue::from_maybe_shared(bytes::Bytes::from(addr.ip().to_string()))
            .expect("an IP address is a valid header value");
        Self { addr, ip }
    }
}
