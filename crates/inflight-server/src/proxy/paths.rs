//! Which requests the proxy limits (`--limit-path`), and the path as `{path}` gives it.
//!
//! So that a client cannot dodge a limit by spelling a path otherwise than the upstream reads it, paths
//! are matched in a canonical form at least as broad as any upstream's reading: percent-escapes decoded
//! once, `/` and `\` both separate segments, empty segments and a segment's `;params` dropped, ASCII
//! letters lower-cased. A path with a `.` or `..` segment (in any spelling) is refused: an upstream that
//! resolves them differently could be led past a limit. The request is forwarded as it came.

/// A path that the proxy refuses to match: it has a dot segment.
pub(super) const DOT_SEGMENT: &str = "The request path has a `.` or `..` segment.";

/// `raw` (a request's path, without its query) in canonical form: `/` followed by the segments joined
/// with `/`; `/` when it has none. Err for a path with a dot segment.
pub(super) fn canonical(raw: &str) -> Result<String, &'static str> {
    let raw = raw.as_bytes();
    let mut out = Vec::with_capacity(raw.len() + 1);
    out.push(b'/');
    // Where the segment being read starts in `out`; whether its `;params` are being skipped.
    let (mut start, mut params) = (1, false);
    let mut at = 0;
    loop {
        let byte = match raw.get(at) {
            None => None,
            Some(b'%') => match raw.get(at + 1..at + 3).and_then(hex_pair) {
                Some(decoded) => {
                    at += 3;
                    Some(decoded)
                }
                None => {
                    at += 1;
                    Some(b'%')
                }
            },
            Some(&byte) => {
                at += 1;
                Some(byte)
            }
        };
        match byte {
            None | Some(b'/' | b'\\') => {
                match &out[start..] {
                    b"" => {}
                    b"." | b".." => return Err(DOT_SEGMENT),
                    _ => {
                        out.push(b'/');
                        start = out.len();
                    }
                }
                params = false;
                if byte.is_none() {
                    break;
                }
            }
            Some(b';') => params = true,
            Some(byte) if !params => out.push(byte.to_ascii_lowercase()),
            Some(_) => {}
        }
    }
    if out.len() > 1 {
        out.pop(); // the `/` after the last segment
    }
    Ok(String::from_utf8(out)
        .unwrap_or_else(|bad| String::from_utf8_lossy(bad.as_bytes()).into_owned()))
}

fn hex_pair(pair: &[u8]) -> Option<u8> {
    let digit = |byte: u8| char::from(byte).to_digit(16);
    Some((digit(pair[0])? * 16 + digit(pair[1])?) as u8)
}

/// The path prefixes whose requests are limited; empty: every request is.
#[derive(Clone, Debug, Default)]
pub struct LimitPaths(Vec<String>);

impl LimitPaths {
    /// The prefixes of `--limit-path`, each in canonical form; Err says why one is unusable.
    pub fn parse<'a>(prefixes: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let mut canonical_prefixes = Vec::new();
        for prefix in prefixes {
            if !prefix.starts_with('/') || prefix.contains(['?', '#', ';', '%']) {
                return Err(format!(
                    "{prefix:?}: use a path such as /v1/chat-messages (no query, `;` or `%`)"
                ));
            }
            let canonical = canonical(prefix).map_err(|_| format!("{prefix:?}: {DOT_SEGMENT}"))?;
            canonical_prefixes.push(canonical);
        }
        Ok(Self(canonical_prefixes))
    }

    /// True when every request is limited (no prefixes were given).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// True when `path` (canonical) is one of the prefixes or lies under one, segment by segment.
    pub(super) fn covers(&self, path: &str) -> bool {
        self.0.iter().any(|prefix| {
            prefix == "/"
                || path
                    .strip_prefix(prefix.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_a_path_has_one_canonical_form() {
        for raw in [
            "/v1/chat-messages",
            "/v1/chat-messages/",
            "//v1//chat-messages",
            "/V1/Chat-Messages",
            "/v1%2Fchat-messages",
            "/v1%2fchat%2Dmessages",
            "/v1\\chat-messages",
            "/v1;x=1/chat-messages;jsessionid=2",
            "v1/chat-messages",
        ] {
            assert_eq!(canonical(raw).as_deref(), Ok("/v1/chat-messages"), "{raw}");
        }
        assert_eq!(canonical("").as_deref(), Ok("/"));
        assert_eq!(canonical("/").as_deref(), Ok("/"));
        assert_eq!(canonical("///").as_deref(), Ok("/"));
        assert_eq!(
            canonical("/a%zz/%").as_deref(),
            Ok("/a%zz/%"),
            "not escapes"
        );
        assert_eq!(canonical("/a%252F").as_deref(), Ok("/a%2f"), "decoded once");
        assert_eq!(canonical("/%C3%A9t%C3%A9").as_deref(), Ok("/été"));
        assert_eq!(canonical("/%FF").as_deref(), Ok("/\u{FFFD}"));
    }

    #[test]
    fn dot_segments_are_refused_in_any_spelling() {
        for raw in [
            "/v1/./chat-messages",
            "/v1/x/../chat-messages",
            "/.",
            "/..",
            "/v1/%2e/chat-messages",
            "/v1/x/%2E%2E/chat-messages",
            "/v1/x%2F..%2Fchat-messages",
            "/v1\\..\\chat-messages",
            "/v1/x/..;/chat-messages",
        ] {
            assert_eq!(canonical(raw), Err(DOT_SEGMENT), "{raw}");
        }
        for fine in ["/v1/.well-known", "/v1/...", "/a.b/..c"] {
            assert!(canonical(fine).is_ok(), "{fine}");
        }
    }

    #[test]
    fn prefixes_match_whole_segments() {
        let paths = LimitPaths::parse(["/v1/chat-messages", "/V1/Workflows/run/"]).unwrap();
        for limited in [
            "/v1/chat-messages",
            "/v1/chat-messages/abc/stop",
            "/v1/workflows/run",
        ] {
            assert!(paths.covers(limited), "{limited}");
        }
        for free in [
            "/v1/chat",
            "/v1/chat-messagesx",
            "/v1",
            "/",
            "/v1/workflows",
        ] {
            assert!(!paths.covers(free), "{free}");
        }
        let chat = LimitPaths::parse(["/v1/chat"]).unwrap();
        assert!(!chat.covers("/v1/chatter"));
        assert!(LimitPaths::parse(["/"]).unwrap().covers("/anything"));
    }

    #[test]
    fn unusable_prefixes_are_refused() {
        for bad in ["v1/chat", "/v1?x=1", "/v1/../x", "/v1;a", "/v1%2Fx", ""] {
            assert!(LimitPaths::parse([bad]).is_err(), "{bad:?}");
        }
    }
}
