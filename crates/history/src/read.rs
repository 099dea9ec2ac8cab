//! Reading histories: one JSON object a line, each field checked; a line that cannot be used names its
//! file and line. Unknown fields are ignored, so that a harness may log more than the checker reads.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::Path;

use crate::line::Line;

/// An interned name: a process, a permit id, a key, a fault's name.
pub(crate) type Sym = u32;

/// Names, each stored once.
#[derive(Default)]
pub(crate) struct Names {
    by_name: HashMap<Box<str>, Sym>,
    names: Vec<Box<str>>,
}

impl Names {
    pub(crate) fn intern(&mut self, name: &str) -> Sym {
        if let Some(&sym) = self.by_name.get(name) {
            return sym;
        }
        let sym = Sym::try_from(self.names.len()).expect("fewer than 2^32 names");
        self.names.push(name.into());
        self.by_name.insert(name.into(), sym);
        sym
    }

    pub(crate) fn get(&self, sym: Sym) -> &str {
        &self.names[sym as usize]
    }
}

/// What a line did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Acquire,
    Release,
    Renew,
    Status,
    Fault,
}

/// Each op: its name, its kind and the results it may have.
const OPS: [(&str, Kind, &[&str]); 5] = [
    (
        "acquire",
        Kind::Acquire,
        &["admitted", "full", "unlimited", "error"],
    ),
    ("release", Kind::Release, &["released", "gone", "error"]),
    (
        "renew",
        Kind::Renew,
        &["renewed", "readded", "lost", "error"],
    ),
    ("status", Kind::Status, &["ok"]),
    ("fault", Kind::Fault, &["ok"]),
];

impl Kind {
    /// Its op's name.
    pub(crate) fn name(self) -> &'static str {
        OPS.iter().find(|op| op.1 == self).expect("every kind").0
    }
}

/// How it ended (`Error`: unknown).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Admitted,
    Full,
    Unlimited,
    Released,
    Gone,
    Renewed,
    Readded,
    Lost,
    Error,
    Ok,
}

/// One line of a history.
#[derive(Debug)]
pub(crate) struct Op {
    pub(crate) process: Sym,
    pub(crate) kind: Kind,
    pub(crate) outcome: Outcome,
    pub(crate) keys: Vec<Sym>,
    pub(crate) id: Sym,
    /// Per key (aligned with `keys`); `token` alone is the first key's.
    pub(crate) tokens: Vec<Option<u64>>,
    pub(crate) weight: u32,
    pub(crate) lease_ns: Option<u64>,
    pub(crate) invoke_ns: u64,
    pub(crate) complete_ns: u64,
    pub(crate) in_flight: Vec<u32>,
    /// A fault's name.
    pub(crate) name: Sym,
    /// Which file (index in [`History::files`]) and line (from 1).
    pub(crate) file: u32,
    pub(crate) line: u32,
}

impl Op {
    /// The fencing token this line gives for its key at `pos`, when it gives one.
    pub(crate) fn token(&self, pos: usize) -> Option<u64> {
        self.tokens.get(pos).copied().flatten()
    }

    /// An admission (or a renewal that re-added the lease): the store created or refreshed a lease.
    pub(crate) fn admits(&self) -> bool {
        matches!(self.outcome, Outcome::Admitted | Outcome::Readded)
    }
}

/// The largest limit any line reports for a key (0, unlimited, above every number).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Limit {
    Unlimited,
    At(u32),
}

/// The lines of one or more files, each checked field by field, and what they say of the keys' limits.
#[derive(Default)]
pub struct History {
    pub(crate) files: Vec<String>,
    pub(crate) ops: Vec<Op>,
    pub(crate) names: Names,
    pub(crate) limits: HashMap<Sym, Limit>,
}

/// A history that cannot be read: the file, the line (from 1) when one is to blame, and why.
#[derive(Debug, thiserror::Error)]
#[error("{file}{}: {reason}", line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct ReadError {
    /// The file, as named on the command line.
    pub file: String,
    /// The line, from 1.
    pub line: Option<usize>,
    /// What is wrong.
    pub reason: String,
}

impl History {
    /// Reads `path` ("-": standard input) into this history.
    pub fn read_file(&mut self, path: &Path) -> Result<(), ReadError> {
        let shown = path.display().to_string();
        let fail = |line, reason: String| ReadError {
            file: shown.clone(),
            line,
            reason,
        };
        if path.as_os_str() == "-" {
            return self.read(&shown, std::io::stdin().lock());
        }
        let file =
            std::fs::File::open(path).map_err(|e| fail(None, format!("cannot open: {e}")))?;
        self.read(&shown, std::io::BufReader::new(file))
    }

    /// Reads the lines of `input` (named `file` in errors) into this history.
    pub fn read(&mut self, file: &str, mut input: impl BufRead) -> Result<(), ReadError> {
        let index = u32::try_from(self.files.len()).expect("fewer than 2^32 files");
        self.files.push(file.to_owned());
        let mut buf = Vec::new();
        let mut number = 0usize;
        loop {
            buf.clear();
            let fail = |line, reason: String| ReadError {
                file: file.to_owned(),
                line,
                reason,
            };
            let n = input
                .read_until(b'\n', &mut buf)
                .map_err(|e| fail(None, format!("cannot read: {e}")))?;
            if n == 0 {
                return Ok(());
            }
            number += 1;
            let text = std::str::from_utf8(&buf)
                .map_err(|_| fail(Some(number), "not UTF-8".to_owned()))?;
            if text.trim().is_empty() {
                continue;
            }
            let raw: Line = serde_json::from_str(text).map_err(|e| {
                let text = e.to_string();
                let reason = match text.rfind(" at line ") {
                    Some(at) => format!("{} (column {})", &text[..at], e.column()),
                    None => text,
                };
                fail(Some(number), format!("not a history line: {reason}"))
            })?;
            let line = u32::try_from(number).unwrap_or(u32::MAX);
            let op = self
                .check(raw, index, line)
                .map_err(|reason| fail(Some(number), reason))?;
            self.ops.push(op);
        }
    }

    /// The line as an [`Op`], or why it cannot be one; records the limits it reports.
    fn check(&mut self, raw: Line, file: u32, line: u32) -> Result<Op, String> {
        use Outcome as O;
        let Some(&(_, kind, results)) = OPS.iter().find(|op| op.0 == raw.op) else {
            let op = &raw.op;
            return Err(format!(
                "unknown op `{op}` (acquire, release, renew, status or fault)"
            ));
        };
        if !results.contains(&&*raw.result) {
            let (result, op, results) = (&raw.result, &raw.op, results.join(", "));
            return Err(format!(
                "unknown result `{result}` of `{op}` (one of: {results})"
            ));
        }
        let outcome = match &*raw.result {
            "admitted" => O::Admitted,
            "full" => O::Full,
            "unlimited" => O::Unlimited,
            "released" => O::Released,
            "gone" => O::Gone,
            "renewed" => O::Renewed,
            "readded" => O::Readded,
            "lost" => O::Lost,
            "error" => O::Error,
            _ => O::Ok,
        };
        if raw.complete_ns < raw.invoke_ns {
            return Err("complete_ns is before invoke_ns".to_owned());
        }
        let keys = raw.keys;
        if keys.is_empty() && kind != Kind::Fault {
            return Err(format!("`{}` without `keys`", raw.op));
        }
        let permit = matches!(kind, Kind::Acquire | Kind::Release | Kind::Renew);
        let id = match (&raw.id, permit) {
            (Some(id), _) => self.names.intern(id),
            (None, true) => return Err(format!("`{}` without `id`", raw.op)),
            (None, false) => self.names.intern(""),
        };
        let aligned = |field: &str, len: usize| match len == keys.len() {
            true => Ok(()),
            false => Err(format!(
                "`{field}` has {len} entries for {} keys",
                keys.len()
            )),
        };
        let tokens = match (raw.tokens, raw.token) {
            (Some(tokens), _) => {
                aligned("tokens", tokens.len())?;
                tokens
            }
            (None, Some(token)) => vec![Some(token)],
            (None, None) => Vec::new(),
        };
        let in_flight = raw.in_flight;
        if kind == Kind::Status {
            aligned("in_flight", in_flight.len())?;
        }
        let confirms = matches!(outcome, O::Admitted | O::Renewed | O::Readded);
        if confirms && raw.lease_ms.is_none() {
            return Err(format!("`{}` `{}` without `lease_ms`", raw.op, raw.result));
        }
        let keys: Vec<Sym> = keys.iter().map(|key| self.names.intern(key)).collect();
        if let Some(limits) = &raw.limits {
            aligned("limits", limits.len())?;
            for (key, limit) in keys.iter().zip(limits) {
                self.limit(*key, *limit);
            }
        }
        Ok(Op {
            process: self.names.intern(&raw.process),
            kind,
            outcome,
            keys,
            id,
            tokens,
            weight: raw.weight.unwrap_or(1),
            lease_ns: raw.lease_ms.map(|ms| ms.saturating_mul(1_000_000)),
            invoke_ns: raw.invoke_ns,
            complete_ns: raw.complete_ns,
            in_flight,
            name: self.names.intern(raw.name.as_deref().unwrap_or("fault")),
            file,
            line,
        })
    }

    /// Keeps the largest limit reported for `key`; 0 (unlimited) above all.
    fn limit(&mut self, key: Sym, reported: Option<u32>) {
        let Some(reported) = reported else { return };
        let reported = match reported {
            0 => Limit::Unlimited,
            n => Limit::At(n),
        };
        let limit = self.limits.entry(key).or_insert(reported);
        *limit = match (*limit, reported) {
            (Limit::At(a), Limit::At(b)) => Limit::At(a.max(b)),
            _ => Limit::Unlimited,
        };
    }

    /// The end of the history: just after the last instant any line names.
    pub(crate) fn end_ns(&self) -> u64 {
        self.ops
            .iter()
            .map(|op| op.complete_ns)
            .max()
            .unwrap_or(0)
            .saturating_add(1)
    }

    /// The first instant any line names (what times in the report are counted from).
    pub(crate) fn start_ns(&self) -> u64 {
        self.ops.iter().map(|op| op.invoke_ns).min().unwrap_or(0)
    }
}
