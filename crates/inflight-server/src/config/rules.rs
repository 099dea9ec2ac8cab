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
    /// `enforce` (the default), or `shadow`: the limits are watched, not enforced (`inflight::Policy::
    /// shadow`): admissions past them are admitted and counted in `inflight_shadow_refusals_total`.
    #[serde(default, skip_serializing_if = "Mode::is_enforce")]
    pub mode: Mode,
}

/// Whether a rule's limits are enforced or only watched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Admissions past the limits are refused (or wait).
    #[default]
    Enforce,
    /// Admissions past the limits are admitted, and counted.
    Shadow,
}

impl Mode {
    fn is_enforce(&self) -> bool {
        *self == Mode::Enforce
    }
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
    /// `PATTERN=DEFAULT[,max=N][,floor=PRIORITY:SLOTS...][,shadow]` (also `PATTERN=default=N,max=N`, or
    /// `PATTERN=max=N`; `shadow` is also `mode=shadow`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let usage = || {
            format!(
                "{text:?}: use PATTERN=DEFAULT[,max=N][,floor=PRIORITY:SLOTS][,shadow], e.g. \
                 'tenant:*=50,max=200', 'model:*=10,floor=9:4' or 'app:*=10,shadow'"
            )
        };
        let (keys, terms) = text.split_once('=').ok_or_else(usage)?;
        let mut rule = LimitRule {
            keys: keys.trim().to_owned(),
            default: 0,
            max: 0,
            floors: Vec::new(),
            mode: Mode::Enforce,
        };
        for (i, term) in terms.split(',').enumerate() {
            let (name, value) = match term.split_once('=') {
                Some((name, value)) => (name.trim(), value),
                None if i > 0 && term.trim() == "shadow" => ("mode", "shadow"),
                None if i == 0 => ("default", term),
                None => return Err(usage()),
            };
            if name == "mode" {
                rule.mode = match value.trim() {
                    "shadow" => Mode::Shadow,
                    "enforce" => Mode::Enforce,
                    _ => return Err(usage()),
                };
                continue;
            }
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
