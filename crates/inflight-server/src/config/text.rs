//! Durations as text (`30s`, `500ms`), as flags, variables and the file give them.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

pub(super) fn serialize<S: Serializer>(value: &Duration, to: S) -> Result<S::Ok, S::Error> {
    to.collect_str(&humantime::format_duration(*value))
}

pub(super) fn deserialize<'de, D: Deserializer<'de>>(from: D) -> Result<Duration, D::Error> {
    parse(&String::deserialize(from)?).map_err(serde::de::Error::custom)
}

/// A duration like 30s or 500ms.
pub(super) fn parse(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration like 30s or 500ms ({e})"))
}
