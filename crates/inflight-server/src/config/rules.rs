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
    /// Slots of each key kept for a priority level while it has holders or waiters there
    /// (`inflight::Floors`): `floors = [{ priority = 9, slots = 4 }]`, `floor=9:4` in a flag.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub floors: Vec<FloorRule>,
}

/// One priority level's floor in a class of keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FloorRule {
    /// The level (0 to 255; higher is served first).
    pub priority: u8,
    /// The slots of each key kept for it.
    pub slots: u32,
}

impl LimitRule {
    /// `PATTERN=DEFAULT[,max=N][,floor=PRIORITY:SLOTS...]` (also `PATTERN=default=N,max=N`, or
    /// `PATTERN=max=N`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let usage = || {
            format!(
                "{text:?}: use PATTERN=DEFAULT[,max=N][,floor=PRIORITY:SLOTS], e.g. \
                 'tenant:*=50,max=200' or 'model:*=10,floor=9:4'"
            )
        };
        let (keys, terms) = text.split_once('=').ok_or_else(usage)?;
        let mut rule = LimitRule {
            keys: keys.trim().to_owned(),
            default: 0,
            max: 0,
            floors: Vec::new(),
        };
        for (i, term) in terms.split(',').enumerate() {
            let (name, value) = match term.split_once('=') {
                Some((name, value)) => (name.trim(), value),
                None if i == 0 => ("default", term),
                None => return Err(usage()),
            };
            if name == "floor" {
                let (priority, slots) = value.split_once(':').ok_or_else(usage)?;
                rule.floors.push(FloorRule {
                    priority: priority.trim().parse().map_err(|_| usage())?,
                    slots: slots.trim().parse().map_err(|_| usage())?,
                });
                continue;
            }
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
