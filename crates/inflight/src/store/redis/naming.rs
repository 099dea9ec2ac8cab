//! Redis key names: a prefix, then the user key escaped inside one hash tag, then a role.
//!
//! `{`, `}`, `%` and control characters are percent-encoded, so no key can close the tag early or spell
//! another key's names; the empty key becomes `%` (an empty tag `{}` is no tag, and a lone `%` encodes
//! nothing else).
//!
//! On Redis Cluster a user key with a hash tag of its own (`{t1}:app:a1`, as Redis reads tags) is named
//! `<prefix>{t1}<escaped key>`, so that keys sharing a tag share a slot and are taken in one script.

use std::fmt::Write;

use crate::id::PermitId;

/// The Redis keys of one user key: `<prefix>{<escaped key>}` and a role suffix, written straight into the
/// command (one allocation per key, not one per name).
#[derive(Clone)]
pub(super) struct KeyNames {
    tag: String,
}

/// One of the names, as a command argument: the tag and the role.
pub(super) struct KeyArg<'a>(&'a str, &'static str);

impl KeyNames {
    /// The names of `key`; `cluster` honours the key's own hash tag.
    pub(super) fn new(prefix: &str, key: &str, cluster: bool) -> Self {
        let mut tag = String::with_capacity(prefix.len() + key.len() + 2);
        tag.push_str(prefix);
        tag.push('{');
        match user_tag(key).filter(|_| cluster) {
            // The user's tag holds no `}`, so it ends at ours; the escaped key after it holds no brace.
            Some(user) => {
                tag.push_str(user);
                tag.push('}');
                escape_into(&mut tag, key);
            }
            None => {
                escape_into(&mut tag, key);
                tag.push('}');
            }
        }
        Self { tag }
    }

    /// `<prefix>{<escaped key>}`: the same for the same user key, different for different ones.
    pub(super) fn tag(&self) -> &str {
        &self.tag
    }

    /// Adds the key's three names to a script invocation, in the order the scripts read them.
    pub(super) fn declare(&self, invocation: &mut redis::ScriptInvocation<'_>) {
        invocation
            .key(self.leases())
            .key(self.permits())
            .key(self.limit());
    }

    /// The sorted set of leases.
    pub(super) fn leases(&self) -> KeyArg<'_> {
        KeyArg(&self.tag, ":leases")
    }

    /// The permits hash (weights and lease lengths).
    pub(super) fn permits(&self) -> KeyArg<'_> {
        KeyArg(&self.tag, ":permits")
    }

    /// The limit override.
    pub(super) fn limit(&self) -> KeyArg<'_> {
        KeyArg(&self.tag, ":limit")
    }
}

impl std::fmt::Display for KeyArg<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)?;
        f.write_str(self.1)
    }
}

impl redis::ToRedisArgs for KeyArg<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        out.write_arg_fmt(self);
    }
}

/// A permit id as Redis stores it (a member of the leases, a field of the permits): a UUID as the byte
/// 0xFF and its 16 bytes, 17 in all where its text takes 36, so that a lease costs Redis less memory and
/// less to compare; any other id as its text. No UTF-8 text starts with 0xFF, so the two never meet.
pub(super) struct Member<'a>(pub(super) &'a PermitId);

impl Member<'_> {
    /// The bytes Redis stores.
    pub(super) fn bytes(&self) -> Vec<u8> {
        redis::ToRedisArgs::to_redis_args(self).concat()
    }
}

impl redis::ToRedisArgs for Member<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        let Some(uuid) = self.0.uuid() else {
            return out.write_arg_fmt(self.0);
        };
        let mut bytes = [0xFF; 17];
        bytes[1..].copy_from_slice(uuid.as_bytes());
        out.write_arg(&bytes);
    }
}

/// The hash tag Redis would read in `key`: after its first `{`, up to the next `}`, when not empty.
fn user_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let len = key[open + 1..].find('}')?;
    (len > 0).then(|| &key[open + 1..open + 1 + len])
}

fn escape_into(out: &mut String, key: &str) {
    if key.is_empty() {
        out.push('%');
        return;
    }
    for c in key.chars() {
        if matches!(c, '{' | '}' | '%') || c.is_control() {
            for b in c.encode_utf8(&mut [0; 4]).bytes() {
                let _ = write!(out, "%{b:02X}");
            }
        } else {
            out.push(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(key: &str) -> String {
        KeyNames::new("inflight:", key, false).leases().to_string()
    }

    #[test]
    fn every_key_gets_one_non_empty_hash_tag() {
        assert_eq!(tag("app-1"), "inflight:{app-1}:leases");
        assert_eq!(tag(""), "inflight:{%}:leases");
        assert_eq!(tag("a}b{c"), "inflight:{a%7Db%7Bc}:leases");
        assert_eq!(tag("x}:limit"), "inflight:{x%7D:limit}:leases");
        assert_eq!(tag("%"), "inflight:{%25}:leases");
        assert_eq!(tag("a\nb\u{0}"), "inflight:{a%0Ab%00}:leases");
        assert_eq!(tag("ünï:code"), "inflight:{ünï:code}:leases");
    }

    #[test]
    fn distinct_keys_never_share_names() {
        let keys = [
            "", "%", "%25", "{", "%7B", "}", "a:b", "a", "b", "\u{0}", "%00",
        ];
        let mut names: Vec<String> = keys.iter().map(|k| tag(k)).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), keys.len());
    }

    #[test]
    fn a_uuid_is_stored_as_17_bytes_and_never_as_a_given_id() {
        let generated = PermitId::generate();
        let bytes = Member(&generated).bytes();
        assert_eq!(bytes.len(), 17);
        assert_eq!(bytes[0], 0xFF);
        assert_eq!(&bytes[1..], generated.uuid().unwrap().as_bytes());
        // Its canonical text is the same id; any other text is a given id, stored as written.
        assert_eq!(
            Member(&PermitId::from(generated.to_string())).bytes(),
            bytes
        );
        let upper = generated.to_string().to_uppercase();
        assert_eq!(
            Member(&PermitId::from(upper.as_str())).bytes(),
            upper.as_bytes()
        );
        assert_eq!(Member(&PermitId::from("req-42")).bytes(), b"req-42");
        assert!(std::str::from_utf8(&bytes).is_err());
    }

    #[test]
    fn the_three_names_share_the_hash_tag() {
        let names = KeyNames::new("p:", "k}", false);
        for name in [names.leases(), names.permits(), names.limit()] {
            assert!(name.to_string().starts_with("p:{k%7D}:"), "{name}");
        }
    }

    #[test]
    fn on_a_cluster_a_keys_own_hash_tag_chooses_its_slot() {
        let name = |key: &str| KeyNames::new("inflight:", key, true).leases().to_string();
        assert_eq!(name("{t1}:app:a1"), "inflight:{t1}%7Bt1%7D:app:a1:leases");
        assert_eq!(name("{t1}:tenant"), "inflight:{t1}%7Bt1%7D:tenant:leases");
        assert_eq!(name("app:{a{b}c"), "inflight:{a{b}app:%7Ba%7Bb%7Dc:leases");
        // No tag (or an empty one): the key's own slot, as on one server.
        assert_eq!(name("app:a1"), "inflight:{app:a1}:leases");
        assert_eq!(name("{}x"), "inflight:{%7B%7Dx}:leases");
        let keys = [
            "{t}",
            "t",
            "{t}x",
            "x{t}",
            "{t}:leases",
            "%7Bt%7D",
            "{t}}",
            "{t}{",
        ];
        let mut names: Vec<String> = keys.iter().map(|k| name(k)).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), keys.len());
        let slot = |key: &str| super::super::connect::slot(name(key).as_bytes());
        assert_eq!(slot("{t1}:app:a1"), slot("{t1}:tenant"));
        assert_eq!(slot("{t1}:app:a1"), super::super::connect::slot(b"t1"));
    }
}
