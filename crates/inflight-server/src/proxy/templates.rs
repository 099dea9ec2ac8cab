//! The keys a proxied request is admitted under, formed from templates parsed once at start-up.
//!
//! A template mixes literal text with placeholders: `{header:NAME}` (the request header NAME's value),
//! `{bearer_hash}` (the first 16 lower-case hex digits of the SHA-256 of the `Authorization: Bearer` token;
//! the token itself goes nowhere), `{path}` (the request's canonical path, see `paths`) and `{path_hash}`
//! (the first 16 hex digits of the SHA-256 of the canonical path: for a path that carries a credential,
//! such as Dify's MCP server URL, whose server code is its only secret) and `{client_ip}` (the client's
//! address: the connection's, or with `--trust-forwarded` the last hop of `X-Forwarded-For`). What each
//! reads of a request is in `sources`.

use http::header::HeaderName;

pub(super) use super::sources::Unformed;
use super::sources::{short_hash, Source};
use crate::api::check_name;

/// The most keys a request may be admitted under (the limiter's limit for one atomic admission).
pub const MAX_KEYS: usize = 16;

/// What to do with a request whose keys cannot be formed (a header missing or empty, no bearer token).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnMissingKey {
    /// 400 `missing_key`.
    Reject,
    /// Forwarded without a limit.
    Pass,
}

/// The key templates of a proxy, parsed.
#[derive(Clone, Debug)]
pub struct KeyTemplates {
    templates: Vec<Template>,
    uses_path: bool,
}

/// One template, parsed: a key's, or `--priority`'s, `--flow`'s (see `standing`) or `--holder`'s.
#[derive(Clone, Debug)]
pub(super) struct Template {
    parts: Vec<Part>,
    /// The bytes of its literal text, to size each value once.
    pub(super) literal_len: usize,
}

#[derive(Clone, Debug)]
enum Part {
    Text(String),
    Header(HeaderName),
    BearerHash,
    Path,
    PathHash,
    ClientIp,
}

impl KeyTemplates {
    /// The templates `texts`, parsed and checked; Err says why one is unusable.
    pub fn parse<'a>(texts: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let key = |text: &str| {
            let template = parse(text)?;
            if let Some(fixed) = template.fixed() {
                check_name(fixed)?; // a fixed key (`global`): checked as any key is
            }
            Ok::<_, String>(template)
        };
        let templates = texts
            .into_iter()
            .map(|text| key(text).map_err(|why| format!("{text:?}: {why}")))
            .collect::<Result<Vec<_>, _>>()?;
        match templates.len() {
            0 => Err("no key templates".to_owned()),
            n if n > MAX_KEYS => Err(format!(
                "{n} templates: at most {MAX_KEYS} keys per request"
            )),
            _ => Ok(Self {
                uses_path: templates.iter().any(Template::uses_path),
                templates,
            }),
        }
    }

    /// One key: the value of the header `name` (what `--key-header` gives).
    pub fn header(name: HeaderName) -> Self {
        Self {
            templates: vec![Template {
                parts: vec![Part::Header(name)],
                literal_len: 0,
            }],
            uses_path: false,
        }
    }

    /// True when a template has `{path}`.
    pub(super) fn uses_path(&self) -> bool {
        self.uses_path
    }

    /// The keys of the request `source`.
    pub(super) fn form(&self, source: &Source<'_>) -> Result<Vec<String>, Unformed> {
        let mut bearer: Option<[u8; 16]> = None;
        let mut keys = Vec::with_capacity(self.templates.len());
        for template in &self.templates {
            let key = template.render(source, &mut bearer)?;
            check_name(&key).map_err(|why| Unformed::Invalid(why.to_owned()))?;
            keys.push(key);
        }
        Ok(keys)
    }
}

impl Template {
    /// Its text, when it has no placeholder.
    pub(super) fn fixed(&self) -> Option<&str> {
        match self.parts.as_slice() {
            [] => Some(""),
            [Part::Text(text)] => Some(text),
            _ => None,
        }
    }

    /// True when it has `{path}` or `{path_hash}`.
    pub(super) fn uses_path(&self) -> bool {
        self.parts
            .iter()
            .any(|part| matches!(part, Part::Path | Part::PathHash))
    }

    /// Its value for the request `source`; `bearer` keeps the bearer token's hash from one template of
    /// the request to the next.
    pub(super) fn render(
        &self,
        source: &Source<'_>,
        bearer: &mut Option<[u8; 16]>,
    ) -> Result<String, Unformed> {
        let mut value = String::with_capacity(self.literal_len + 32);
        for part in &self.parts {
            match part {
                Part::Text(text) => value.push_str(text),
                Part::Header(name) => value.push_str(source.header(name)?),
                Part::Path => value.push_str(source.path),
                Part::PathHash => {
                    value.extend(short_hash(source.path).iter().map(|&d| char::from(d)))
                }
                Part::ClientIp => value.push_str(&source.client_ip()),
                Part::BearerHash => {
                    let hash = match bearer {
                        Some(hash) => *hash,
                        None => *bearer.insert(source.bearer_hash()?),
                    };
                    value.extend(hash.iter().map(|&digit| char::from(digit)));
                }
            }
        }
        Ok(value)
    }
}

/// The template `text` of a free-text value (`--flow`, `--holder`: `what`, at most `max_len` bytes), parsed
/// and checked as far as its text goes: not empty (without the flag, `unset`), not longer alone.
pub(super) fn parse_text(
    text: &str,
    (flag, what, max_len): (&str, &str, usize),
    unset: &str,
) -> Result<Template, String> {
    let template = parse(text).map_err(|why| format!("{text:?}: {why}"))?;
    if template.fixed() == Some("") {
        return Err(format!("an empty template: leave {flag} unset {unset}"));
    }
    if template.literal_len > max_len {
        return Err(format!(
            "{text:?}: {what} is at most {max_len} bytes, and its text alone is more"
        ));
    }
    Ok(template)
}

/// The template `text`, parsed; a fixed text is left for its user to check (as a key, a level...).
pub(super) fn parse(text: &str) -> Result<Template, String> {
    let mut parts = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(['{', '}']) {
        if rest[at..].starts_with('}') {
            return Err("a `}` without its `{`".to_owned());
        }
        parts.push(Part::Text(rest[..at].to_owned()));
        let inner = &rest[at + 1..];
        let end = inner
            .find(['{', '}'])
            .filter(|&end| inner[end..].starts_with('}'))
            .ok_or("a `{` without its `}`")?;
        parts.push(placeholder(&inner[..end])?);
        rest = &inner[end + 1..];
    }
    parts.push(Part::Text(rest.to_owned()));
    parts.retain(|part| !matches!(part, Part::Text(text) if text.is_empty()));
    let mut literal_len = 0;
    for part in &parts {
        if let Part::Text(text) = part {
            literal_len += text.len();
            if text.chars().any(char::is_control) {
                return Err("control characters in the text".to_owned());
            }
        }
    }
    Ok(Template { parts, literal_len })
}

/// Headers whose values are secrets: no template may put them in a key.
const SECRET_HEADERS: [HeaderName; 3] = [
    http::header::AUTHORIZATION,
    http::header::PROXY_AUTHORIZATION,
    http::header::COOKIE,
];

fn placeholder(inner: &str) -> Result<Part, String> {
    match inner {
        "path" => Ok(Part::Path),
        "path_hash" => Ok(Part::PathHash),
        "bearer_hash" => Ok(Part::BearerHash),
        "client_ip" => Ok(Part::ClientIp),
        _ => match inner.strip_prefix("header:") {
            Some("") => Err("an empty header name in `{header:}`".to_owned()),
            Some(name) => match HeaderName::from_bytes(name.as_bytes()) {
                // Their values are secrets, which keys (and so metrics and logs) must never hold.
                Ok(name) if SECRET_HEADERS.contains(&name) => Err(format!(
                    "{name} carries a secret, which a key would show: use {{bearer_hash}}"
                )),
                Ok(name) => Ok(Part::Header(name)),
                Err(_) => Err(format!("{name:?} is not a header name")),
            },
            None => Err(format!(
                "unknown placeholder `{{{inner}}}`: use {{header:NAME}}, {{bearer_hash}}, {{path}}, \
                 {{path_hash}} or {{client_ip}}"
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::sources::tests::{headers, source};

    fn form(templates: &[&str], pairs: &[(&str, &str)]) -> Result<Vec<String>, Unformed> {
        KeyTemplates::parse(templates.iter().copied())
            .unwrap()
            .form(&source(&headers(pairs), "/v1/chat-messages"))
    }

    #[test]
    fn templates_mix_text_and_placeholders() {
        let keys = form(
            &[
                "tenant:{header:X-Tenant-Id}",
                "app:{header:x-tenant-id}/{header:X-App-Id}",
                "route:{path}",
                "ip:{client_ip}",
                "global",
            ],
            &[("x-tenant-id", "acme"), ("X-App-Id", "chat")],
        );
        assert_eq!(
            keys.unwrap(),
            [
                "tenant:acme",
                "app:acme/chat",
                "route:/v1/chat-messages",
                "ip:192.0.2.10",
                "global"
            ]
        );
    }

    #[test]
    fn the_path_hash_is_16_hex_digits_of_the_canonical_paths_sha256() {
        let templates = KeyTemplates::parse(["mcp:{path_hash}"]).unwrap();
        assert!(templates.uses_path());
        // SHA-256("/mcp/server/abc/mcp"), as `printf %s /mcp/server/abc/mcp | sha256sum` gives it.
        let keys = templates
            .form(&source(&headers(&[]), "/mcp/server/abc/mcp"))
            .unwrap();
        let want = ring::digest::digest(&ring::digest::SHA256, b"/mcp/server/abc/mcp");
        let hex: String = want.as_ref()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(keys, [format!("mcp:{hex}")]);
        assert!(!keys[0].contains("abc"), "the path itself goes nowhere");
    }

    #[test]
    fn the_bearer_hash_is_16_hex_digits_of_the_tokens_sha256() {
        // SHA-256("abc") = ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad (FIPS 180-2).
        let want = "ba7816bf8f01cfea";
        for authorization in [
            "Bearer abc",
            "bearer abc",
            "BEARER   abc",
            "Bearer \tabc",
            "Bearer\tabc",
            "Bearer\t abc \t",
        ] {
            let keys = form(
                &["user:{bearer_hash}", "{bearer_hash}"],
                &[("authorization", authorization)],
            );
            assert_eq!(
                keys.unwrap(),
                [format!("user:{want}"), want.to_owned()],
                "{authorization}"
            );
        }
        for unusable in ["Basic YWJj", "Bearer", "Bearer ", "Bearerabc"] {
            let keys = form(&["{bearer_hash}"], &[("authorization", unusable)]);
            assert!(matches!(keys, Err(Unformed::Missing(_))), "{unusable}");
        }
        let spaced = form(&["{bearer_hash}"], &[("authorization", "Bearer a b")]);
        assert!(
            matches!(spaced, Err(Unformed::Invalid(_))),
            "refused, not passed"
        );
        let missing = form(&["{bearer_hash}"], &[]);
        assert!(matches!(missing, Err(Unformed::Missing(_))));
        let twice = form(
            &["{bearer_hash}"],
            &[("authorization", "Bearer a"), ("authorization", "Bearer b")],
        );
        assert!(matches!(twice, Err(Unformed::Invalid(_))));
    }

    #[test]
    fn missing_empty_and_duplicated_headers() {
        let templates = ["t:{header:X-Tenant-Id}"];
        assert_eq!(
            form(&templates, &[]),
            Err(Unformed::Missing(
                "The request has no x-tenant-id header.".to_owned()
            ))
        );
        let empty = form(&templates, &[("x-tenant-id", "")]);
        assert!(matches!(empty, Err(Unformed::Missing(_))));
        let long = "x".repeat(300);
        for invalid in [
            &[("x-tenant-id", "a"), ("X-Tenant-Id", "b")][..],
            &[("x-tenant-id", "a\tb")],
            &[("x-tenant-id", &long)],
        ] {
            let formed = form(&templates, invalid);
            assert!(matches!(formed, Err(Unformed::Invalid(_))), "{invalid:?}");
        }
    }

    #[test]
    fn bad_templates_are_refused_at_start_up() {
        for (bad, why) in [
            ("t:{header:}", "empty header name"),
            ("t:{tenant}", "unknown placeholder"),
            ("t:{header:X", "without its `}`"),
            ("t:{header:{X}}", "without its `}`"),
            ("t:}", "without its `{`"),
            ("t:{header:X Y}", "not a header name"),
            ("", "empty"),
            ("a\u{7}b", "control"),
            ("u:{header:Authorization}", "secret"),
            ("u:{header:cookie}", "secret"),
            ("u:{header:Proxy-Authorization}", "secret"),
        ] {
            let err = KeyTemplates::parse([bad]).unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
        let seventeen = vec!["k"; MAX_KEYS + 1];
        assert!(KeyTemplates::parse(seventeen).is_err());
        assert!(KeyTemplates::parse(vec!["k"; MAX_KEYS]).is_ok());
        assert!(KeyTemplates::parse([]).is_err());
    }
}
