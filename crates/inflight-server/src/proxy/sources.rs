//! What a template reads of a request ([`Source`]): a header's one value, the bearer token's hash, the
//! canonical path and the client's address; and [`short_hash`], how the proxy shows a secret or a key
//! without showing it.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};

use http::header::{self, HeaderMap, HeaderName};

use super::headers::X_FORWARDED_FOR;
use super::Peer;

/// A request as templates read it.
#[derive(Clone, Copy)]
pub(super) struct Source<'a> {
    pub(super) headers: &'a HeaderMap,
    /// Its canonical path (`paths`), read only for `{path}` and `{path_hash}` (else empty).
    pub(super) path: &'a str,
    /// The connection's other end.
    pub(super) peer: &'a Peer,
    /// Whether `X-Forwarded-For` is trusted (`--trust-forwarded`): then `{client_ip}` reads it.
    pub(super) trust_forwarded: bool,
}

impl<'a> Source<'a> {
    /// The one value of the header `name`, non-empty and visible ASCII.
    pub(super) fn header(&self, name: &HeaderName) -> Result<&'a str, Unformed> {
        let mut values = self.headers.get_all(name).iter();
        let value = values
            .next()
            .ok_or_else(|| Unformed::Missing(format!("The request has no {name} header.")))?;
        if values.next().is_some() {
            // Which one would the upstream read? Neither is the key.
            let why = format!("The request has more than one {name} header.");
            return Err(Unformed::Invalid(why));
        }
        match value.to_str() {
            Err(_) => Err(Unformed::Invalid(format!(
                "The {name} header is not visible ASCII."
            ))),
            Ok("") => Err(Unformed::Missing(format!("The {name} header is empty."))),
            Ok(text) => Ok(text),
        }
    }

    /// The first 16 hex digits (lower-case) of the SHA-256 of the request's bearer token.
    pub(super) fn bearer_hash(&self) -> Result<[u8; 16], Unformed> {
        let no_token = || Unformed::Missing("The request has no bearer token.".to_owned());
        let mut values = self.headers.get_all(header::AUTHORIZATION).iter();
        let value = values.next().ok_or_else(no_token)?;
        if values.next().is_some() {
            let why = "The request has more than one authorization header.";
            return Err(Unformed::Invalid(why.to_owned()));
        }
        // A token with whitespace inside is refused, never passed: each spelling of it would be a key of
        // its own.
        let text = value.to_str().map_err(|_| no_token())?;
        let token = crate::auth::bearer_token(text).ok_or_else(no_token)?;
        if token.contains(|c: char| c.is_ascii_whitespace()) {
            let why = "The bearer token has whitespace in it.";
            return Err(Unformed::Invalid(why.to_owned()));
        }
        Ok(short_hash(token))
    }

    /// `{client_ip}`: the address of the connection's other end; with `--trust-forwarded`, the last
    /// address of `X-Forwarded-For`, the one the proxy's own load balancer saw and appended (a client
    /// writes what it likes before it), when that is an address (else the connection's).
    pub(super) fn client_ip(&self) -> Cow<'a, str> {
        if self.trust_forwarded {
            if let Some(ip) = last_forwarded_for(self.headers) {
                return Cow::Owned(ip.to_string());
            }
        }
        Cow::Borrowed(self.peer.ip.to_str().unwrap_or_default())
    }
}

/// The last hop of the last `X-Forwarded-For` header, as an address (`203.0.113.7`, `2001:db8::1`, and
/// with a port, `203.0.113.7:41234` or `[2001:db8::1]:41234`); None when it is not one.
fn last_forwarded_for(headers: &HeaderMap) -> Option<IpAddr> {
    let value = headers.get_all(X_FORWARDED_FOR).iter().next_back()?;
    let hop = value.to_str().ok()?.rsplit(',').next()?.trim();
    hop.parse::<IpAddr>()
        .or_else(|_| hop.parse::<SocketAddr>().map(|addr| addr.ip()))
        .ok()
}

/// The first 16 hex digits of the SHA-256 of `text`: `{bearer_hash}`, and how access lines show keys.
pub(super) fn short_hash(text: &str) -> [u8; 16] {
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    let mut hex = [0u8; 16];
    for (pair, byte) in hex.chunks_exact_mut(2).zip(digest.as_ref()) {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0xf)];
    }
    hex
}

/// Why a request's keys could not be formed.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Unformed {
    /// Something a template needs is absent or empty: `--on-missing-key` decides.
    Missing(String),
    /// Something is there but unusable (a duplicated header, a key `check_name` refuses): always a 400.
    Invalid(String),
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::LazyLock;

    use http::HeaderValue;

    use super::*;

    /// The peer of the template tests' requests.
    pub(in crate::proxy) static PEER: LazyLock<Peer> =
        LazyLock::new(|| Peer::new("192.0.2.10:5555".parse().unwrap()));

    /// A request's headers, as `pairs` give them (the proxy's template tests share it).
    pub(in crate::proxy) fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    /// A request with `headers` and the canonical path `path`, from [`PEER`], forwarded headers not
    /// trusted.
    pub(in crate::proxy) fn source<'a>(headers: &'a HeaderMap, path: &'a str) -> Source<'a> {
        Source {
            headers,
            path,
            peer: &PEER,
            trust_forwarded: false,
        }
    }

    #[test]
    fn the_client_ip_is_the_peers_unless_forwarded_headers_are_trusted() {
        let forwarded = headers(&[
            ("x-forwarded-for", "10.9.9.9"),
            ("x-forwarded-for", "198.51.100.1, 203.0.113.7"),
        ]);
        let untrusted = source(&forwarded, "/");
        assert_eq!(
            untrusted.client_ip(),
            "192.0.2.10",
            "what the client says goes nowhere"
        );
        let trusted = Source {
            trust_forwarded: true,
            ..untrusted
        };
        assert_eq!(
            trusted.client_ip(),
            "203.0.113.7",
            "the hop the balancer saw"
        );
        for (value, want) in [
            ("203.0.113.7:41234", "203.0.113.7"),
            (" 2001:DB8::1 ", "2001:db8::1"),
            ("a, [2001:db8::1]:443", "2001:db8::1"),
            // Not an address: the connection's.
            ("unknown", "192.0.2.10"),
            ("203.0.113.7, ", "192.0.2.10"),
            ("", "192.0.2.10"),
        ] {
            let one = headers(&[("x-forwarded-for", value)]);
            let trusted = Source {
                trust_forwarded: true,
                ..source(&one, "/")
            };
            assert_eq!(trusted.client_ip(), want, "{value:?}");
        }
        let none = headers(&[]);
        let trusted = Source {
            trust_forwarded: true,
            ..source(&none, "/")
        };
        assert_eq!(trusted.client_ip(), "192.0.2.10");
    }
}
