//! Fundings that apply once: every funding carries an [`IdempotencyKey`], and the store remembers the
//! keys it applied, with their answers, so that the same funding sent again (a client's re-send after a
//! dropped connection, a caller's retry) is answered as the first was and changes nothing
//! ([`crate::quota::Funding`]).

use std::fmt;
use std::time::Duration;

use crate::id::PermitId;

/// How long a store remembers an idempotency key a caller gave ([`IdempotencyKey::from`]): a day, the
/// expiry the IETF draft "The Idempotency-Key HTTP Header Field" takes as its example, and far longer
/// than a client retries a top-up before a person looks at it.
pub const FUNDING_MEMORY: Duration = Duration::from_secs(86_400);

/// How long a store remembers a generated idempotency key ([`IdempotencyKey::generate`], one per
/// [`crate::Quota::fund`] call): only the call's own re-sends use it, and the last of those comes
/// within seconds (the response timeout times the retries).
pub const GENERATED_FUNDING_MEMORY: Duration = Duration::from_secs(600);

/// The most idempotency keys a store remembers per quota key; past it, the one to be forgotten soonest
/// goes first (so a funding every second keeps the last 18 h of given keys).
pub const MAX_REMEMBERED_FUNDINGS: u32 = 65_536;

/// What makes a funding apply once: the same key on the same quota key within [`FUNDING_MEMORY`] is the
/// same funding. Generated keys are UUID v4; a caller may give its own (a payment id, an HTTP
/// `Idempotency-Key`), so that its retries apply once too.
///
/// ```
/// use inflight::quota::IdempotencyKey;
///
/// let given = IdempotencyKey::from("payment-42");
/// assert_eq!(given.to_string(), "payment-42");
/// assert_ne!(IdempotencyKey::generate(), IdempotencyKey::generate());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey {
    id: PermitId,
    given: bool,
}

impl IdempotencyKey {
    /// A new random key (UUID v4), remembered for [`GENERATED_FUNDING_MEMORY`].
    pub fn generate() -> Self {
        Self {
            id: PermitId::generate(),
            given: false,
        }
    }

    /// True for the empty key, which no funding may have.
    pub fn is_empty(&self) -> bool {
        self.id.is_empty()
    }

    /// How long a store remembers it.
    pub fn memory(&self) -> Duration {
        if self.given {
            FUNDING_MEMORY
        } else {
            GENERATED_FUNDING_MEMORY
        }
    }

    /// The key as an id (its compact form in Redis).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn id(&self) -> &PermitId {
        &self.id
    }
}

impl From<&str> for IdempotencyKey {
    fn from(key: &str) -> Self {
        Self {
            id: PermitId::from(key),
            given: true,
        }
    }
}

impl From<String> for IdempotencyKey {
    fn from(key: String) -> Self {
        Self::from(key.as_str())
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.id, f)
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey({self})")
    }
}
