//! The line of a history (docs/histories.md, "The format"): what the harness's writers log and the
//! reader reads. Unknown fields are ignored when read, so that a writer may log more.

use serde::{Deserialize, Deserializer, Serialize};

/// One operation a client completed or gave up on, a status read at the end, or a fault in force.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Line {
    /// Who ran it: `"rust-3"`, `"py-1"`, `"runner"`.
    pub process: String,
    /// `acquire`, `release`, `renew`, `status` or `fault`.
    pub op: String,
    /// The permit's keys; for `status`, the keys read; for `fault`, may be empty.
    #[serde(default, deserialize_with = "nullable")]
    pub keys: Vec<String>,
    /// The permit id (required for `acquire`, `release`, `renew`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The fencing token for the first key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// Or one token per key, aligned with `keys`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Vec<Option<u64>>>,
    /// The permit's weight (none: 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// The permit's lease (required for `admitted`, `renewed`, `readded`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
    /// The limit in force per key as the client knows it (0: unlimited).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<Vec<Option<u32>>>,
    /// When the client began, in ns since the Unix epoch.
    pub invoke_ns: u64,
    /// When it finished.
    pub complete_ns: u64,
    /// How it ended ("error": unknown).
    pub result: String,
    /// For `status`: the count per key.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub in_flight: Vec<u32>,
    /// For `fault`: which fault.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// `null` read as a missing field is.
fn nullable<'de, D: Deserializer<'de>, T: Default + Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    Ok(Option::deserialize(d)?.unwrap_or_default())
}
