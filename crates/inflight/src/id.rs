//! Permit ids: a generated UUID v4, or an id the caller gives.

use std::fmt;
use std::sync::Arc;

use uuid::Uuid;

/// The id of one permit: unique within its key.
///
/// Generated ids are UUID v4. A caller may give its own (its request id, say), so that a retry counts
/// once; a given canonical (lower-case, hyphenated) UUID is the same id as the generated UUID it spells.
///
/// ```
/// use inflight::PermitId;
///
/// let id: PermitId = "req-42".into();
/// assert_eq!(id.to_string(), "req-42");
/// let generated = PermitId::generate();
/// assert_eq!(PermitId::from(generated.to_string()), generated);
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PermitId(Repr);

#[derive(Clone, PartialEq, Eq, Hash)]
enum Repr {
    Uuid(Uuid),
    Given(Arc<str>),
}

impl PermitId {
    /// A new random id (UUID v4).
    pub fn generate() -> Self {
        Self(Repr::Uuid(Uuid::new_v4()))
    }

    /// True for the empty id, which no permit may have.
    pub fn is_empty(&self) -> bool {
        matches!(&self.0, Repr::Given(s) if s.is_empty())
    }

    /// The UUID, for a generated id (or a given one that spells a UUID canonically).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn uuid(&self) -> Option<&Uuid> {
        match &self.0 {
            Repr::Uuid(u) => Some(u),
            Repr::Given(_) => None,
        }
    }
}

impl From<&str> for PermitId {
    fn from(s: &str) -> Self {
        match Uuid::try_parse(s) {
            Ok(u) if u.hyphenated().encode_lower(&mut Uuid::encode_buffer()) == s => {
                Self(Repr::Uuid(u))
            }
            _ => Self(Repr::Given(Arc::from(s))),
        }
    }
}

impl From<String> for PermitId {
    fn from(s: String) -> Self {
        Self::from(s.as_str())
    }
}

impl From<Uuid> for PermitId {
    fn from(u: Uuid) -> Self {
        Self(Repr::Uuid(u))
    }
}

impl fmt::Display for PermitId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Repr::Uuid(u) => fmt::Display::fmt(&u.hyphenated(), f),
            Repr::Given(s) => f.write_str(s),
        }
    }
}

impl fmt::Debug for PermitId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PermitId({self})")
    }
}
