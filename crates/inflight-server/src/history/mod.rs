//! `inflight check-history FILE...`: what a fault run's histories prove (docs/histories.md).
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
//! O(n log n): sorts, then sweeps per slot and per key. Exit codes: [`OK`], [`FOUND`], [`UNREADABLE`].

mod check;
mod held;
mod read;
mod report;
mod text;
mod tokens;

#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

pub use read::ReadError;
pub use report::{ExcessExample, FaultReport, KeyReport, Line, Report, TokenExample};

/// Exit code: read, and nothing certain went wrong.
pub const OK: u8 = 0;
/// Exit code: a certain over-admission, or a token going backwards.
pub const FOUND: u8 = 1;
/// Exit code: a file could not be read or a line could not be used (and clap's usage errors).
pub const UNREADABLE: u8 = 2;

/// The arguments of `inflight check-history`.
#[derive(Debug, Args)]
pub struct CheckHistoryArgs {
    /// History files, one JSON object a line ("-": standard input); read as one history.
    #[arg(value_name = "FILE", required = true)]
    pub files: Vec<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Reads and checks `files` as one history.
pub fn check_files(files: &[PathBuf]) -> Result<Report, ReadError> {
    let mut history = read::History::default();
    for file in files {
        history.read_file(file)?;
    }
    Ok(check(&history))
}

/// Checks one history given as text (`name` in errors).
pub fn check_text(name: &str, text: &str) -> Result<Report, ReadError> {
    let mut history = read::History::default();
    history.read(name, text.as_bytes())?;
    Ok(check(&history))
}

fn check(history: &read::History) -> Report {
    let held = held::held(history);
    let keys = check::over_admission(history, &held);
    let tokens = tokens::tokens(history, &held);
    report::report(history, keys, tokens)
}

/// Runs `inflight check-history`: prints the report on stdout, or what could not be read on stderr.
pub fn run(args: &CheckHistoryArgs) -> ExitCode {
    let report = match check_files(&args.files) {
        Ok(report) => report,
        Err(error) => {
            eprintln!("inflight check-history: {error}");
            return ExitCode::from(UNREADABLE);
        }
    };
    if args.json {
        match serde_json::to_string(&report) {
            Ok(json) => println!("{json}"),
            Err(error) => {
                eprintln!("inflight check-history: {error}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", report.text());
    }
    ExitCode::from(if report.ok { OK } else { FOUND })
}
