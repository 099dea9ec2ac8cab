//! The report as text, for a person: totals, each key, what went wrong with examples, the verdict.

use std::fmt::Write;

use crate::report::{ExampleLine, Report};

/// Keys listed one per line; the others are counted (`--json` lists every key).
const KEYS: usize = 20;

impl Report {
    /// The report as lines of text.
    pub fn text(&self) -> String {
        let mut out = String::new();
        self.write(&mut out).expect("a String takes any text");
        out
    }

    fn write(&self, out: &mut String) -> std::fmt::Result {
        writeln!(
            out,
            "inflight check-history: {} file{}, {} operations ({} admissions, {} with an unknown outcome)",
            self.files.len(),
            plural(self.files.len()),
            self.operations,
            self.admissions,
            self.unknown_outcomes
        )?;
        if !self.keys.is_empty() {
            writeln!(out, "keys:")?;
        }
        for key in self.keys.iter().take(KEYS) {
            let limit = match key.limit {
                None => "no limit reported".to_owned(),
                Some(0) => "unlimited".to_owned(),
                Some(n) => format!("limit {n}"),
            };
            writeln!(
                out,
                "  {}: {limit}, {} admissions, at most {} certainly held",
                key.key, key.admissions, key.peak_held
            )?;
        }
        if self.keys.len() > KEYS {
            writeln!(out, "  ... and {} more keys", self.keys.len() - KEYS)?;
        }
        if self.over_admissions == 0 {
            writeln!(out, "over-admission: none certain")?;
        } else {
            writeln!(
                out,
                "over-admission: {} episode{}, largest excess {}",
                self.over_admissions,
                plural(self.over_admissions as usize),
                self.largest_excess
            )?;
        }
        for key in self.keys.iter().filter(|key| key.over_admissions > 0) {
            writeln!(
                out,
                "  {} (limit {}): {} episode{}, largest excess {}",
                key.key,
                key.limit.unwrap_or(0),
                key.over_admissions,
                plural(key.over_admissions as usize),
                key.largest_excess
            )?;
            for example in &key.examples {
                let holders: Vec<String> = example
                    .holders
                    .iter()
                    .map(|line| format!("{} weight {}", who(line), line.weight))
                    .collect();
                writeln!(
                    out,
                    "    at +{:.3} ms, {} certainly held: {}",
                    example.at_ms,
                    example.held,
                    holders.join(", ")
                )?;
            }
        }
        if self.token_violations == 0 {
            writeln!(
                out,
                "tokens: {} admissions of one key compared, none going backwards",
                self.tokens_compared
            )?;
        } else {
            writeln!(out, "tokens going backwards: {}", self.token_violations)?;
        }
        for example in &self.token_examples {
            writeln!(
                out,
                "  {}: token {} of {} (invoked +{:.3} ms) is not above token {} of {}",
                example.key,
                example.later.token.unwrap_or_default(),
                who(&example.later),
                example.later.invoke_ms,
                example.earlier.token.unwrap_or_default(),
                who(&example.earlier),
            )?;
        }
        let leaked: Vec<String> = self
            .keys
            .iter()
            .filter_map(|key| {
                key.leaked
                    .filter(|n| *n > 0)
                    .map(|n| format!("{}: {n}", key.key))
            })
            .collect();
        match (
            self.slots_leaked,
            self.keys.iter().any(|key| key.leaked.is_some()),
        ) {
            (_, false) => writeln!(out, "slots leaked at the end: unknown (no status line)")?,
            (0, true) => writeln!(out, "slots leaked at the end: none")?,
            (n, true) => writeln!(out, "slots leaked at the end: {n} ({})", leaked.join(", "))?,
        }
        let lost: Vec<String> = self
            .keys
            .iter()
            .filter(|key| key.lost > 0)
            .map(|key| format!("{}: {}", key.key, key.lost))
            .collect();
        match self.permits_lost {
            0 => writeln!(out, "permits lost: none")?,
            n => writeln!(out, "permits lost: {n} ({})", lost.join(", "))?,
        }
        if self.faults.is_empty() {
            writeln!(out, "faults: none")?;
        } else {
            writeln!(out, "faults:")?;
        }
        for fault in &self.faults {
            let recovery = match fault.recovery_ms {
                Some(ms) => format!("first admission {ms:.3} ms after its end"),
                None => "no admission after its end".to_owned(),
            };
            writeln!(out, "  {} ({}): {recovery}", fault.name, fault.process)?;
        }
        let mut failed = Vec::new();
        if self.over_admissions > 0 {
            failed.push("certain over-admission");
        }
        if self.token_violations > 0 {
            failed.push("tokens going backwards");
        }
        match failed.is_empty() {
            true => writeln!(out, "result: ok"),
            false => writeln!(out, "result: FAILED ({})", failed.join(", ")),
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// "process id ID (file:line)".
fn who(line: &ExampleLine) -> String {
    format!("{} {} id {} ({})", line.op, line.process, line.id, line.at)
}
