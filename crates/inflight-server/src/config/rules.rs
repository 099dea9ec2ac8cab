//! `--limit` and `[[limits]]`: the limits of a class of keys, as an operator writes them.

use serde::{Deserialize, Serialize};

/// The limits of one class of keys: `[[limits]]` in the file, `--limit` as a flag.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitRule {
    /// The keys of the class: a glob pattern, `*` matching any run of characters.
    pub keys: String,
    /// The limit of a key of the class without an override; 0 = unlimited.
    #[serde(default)]
    pub default: u32,
    /// The ceiling over every key of the class, overrides included; 0 = none.
    #[serde(default)]
    pub max: u32,
}

impl LimitRule {
    /// `PATTERN=DEFAULT[,max=N]` (also `PATTERN=default=N,max=N`, or `PATTERN=max=N`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let usage = || format!("{text:?}: use PATTERN=DEFAULT[,max=N], e.g. 'tenant:*=50,max=200'");
        let (keys, terms) = text.split_once('=').ok_or_else(usage)?;
        let mut rule = LimitRule {
            keys: keys.trim().to_owned(),
            default: 0,
            max: 0,
        };
        for (i, term) in terms.split(',').enumerate() {
            let (name, value) = match term.split_once('=') {
                Some((name, value)) => (name.trim(), value),
                None if i == 0 => ("default", term),
                None => return Err(usage()),
            };
            let value = value.trim().parse().map_err(|_| usage())?;
            match name {
                "default" => rule.default = value,
                "max" => rule.max = value,
                _ => return Err(usage()),
            }
        }
        Ok(rule)
    }
}
