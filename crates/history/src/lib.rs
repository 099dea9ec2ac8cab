//! What a fault run's histories prove (docs/histories.md): the line format the harness's writers share
//! ([`Line`]), and the checker behind `inflight check-history`.
//!
//! Every client of a run logs one JSON line per operation: its process, op, keys, permit id, weight,
//! lease, the limit it knows, the fencing token it was given, invoke and complete times on one clock,
//! and the result ("error" when the outcome is unknown). The checker reports only what is *certain*:
//!
//! - **Over-admission** (check.rs): a slot (a key and a permit id: the store counts an id once) is
//!   certainly held from an admission's or renewal's complete until its lease could have run out
//!   (invoke + lease), or until a release or a "lost" renewal that may concern it is invoked (held.rs).
//!   Unknown outcomes are never held, but may end or shorten what is. Where the weight of the slots
//!   certainly held on a key exceeds the largest limit any line reports for it (0: unlimited, never),
//!   that is an over-admission; a stretch of such instants is one episode.
//! - **Tokens going backwards** (tokens.rs): a line's `token` is its admission's token for its first key
//!   (`tokens`, one per key, is read too), and only admissions of one key are compared, since on Redis
//!   Cluster a permit over keys in several slots carries the token of one slot only.
//! - Slots leaked at the end (the last status line), permits reported lost, the time to the first
//!   admission after each fault (report.rs).
//!
//! O(n log n): sorts, then sweeps per slot and per key.
//!
//! ```
//! use inflight_history::{check_text, Line};
//!
//! let admitted = |process: &str, id: &str, at: u64| Line {
//!     process: process.into(),
//!     op: "acquire".into(),
//!     keys: vec!["tenant:7".into()],
//!     id: Some(id.into()),
//!     lease_ms: Some(30_000),
//!     limits: Some(vec![Some(1)]),
//!     invoke_ns: at,
//!     complete_ns: at + 1,
//!     result: "admitted".into(),
//!     ..Line::default()
//! };
//! let lines = [admitted("rust-1", "a1", 0), admitted("py-1", "b1", 10)];
//! let text: Vec<String> = lines.iter().map(|l| serde_json::to_string(l).unwrap()).collect();
//! let report = check_text("run.jsonl", &text.join("\n"))?;
//! assert!(!report.ok);
//! assert_eq!((report.over_admissions, report.largest_excess), (1, 1));
//! # Ok::<(), inflight_history::ReadError>(())
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod check;
mod held;
mod line;
mod read;
mod report;
mod text;
mod tokens;

use std::path::PathBuf;

pub use line::Line;
pub use read::{History, ReadError};
pub use report::{ExampleLine, ExcessExample, FaultReport, KeyReport, Report, TokenExample};

/// Reads and checks `files` ("-": standard input) as one history.
pub fn check_files(files: &[PathBuf]) -> Result<Report, ReadError> {
    let mut history = History::default();
    for file in files {
        history.read_file(file)?;
    }
    Ok(check(&history))
}

/// Checks one history given as text (`name` in errors).
pub fn check_text(name: &str, text: &str) -> Result<Report, ReadError> {
    let mut history = History::default();
    history.read(name, text.as_bytes())?;
    Ok(check(&history))
}

/// What `history` proves.
pub fn check(history: &History) -> Report {
    let held = held::held(history);
    let keys = check::over_admission(history, &held);
    let tokens = tokens::tokens(history, &held);
    report::report(history, keys, tokens)
}
