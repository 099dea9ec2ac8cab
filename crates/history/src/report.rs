//! What `inflight check-history` reports: built from the checks, printed as text (text.rs) or as one
//! JSON object (`--json`).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::check::KeyCheck;
use crate::read::{History, Kind, Limit, Op, Outcome, Sym};
use crate::tokens::TokenCheck;

/// The findings over one or more history files.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// No certain over-admission and no token going backwards.
    pub ok: bool,
    /// The files read, in order.
    pub files: Vec<String>,
    /// Lines of clients (every line but faults).
    pub operations: u64,
    /// Acquires answered "admitted".
    pub admissions: u64,
    /// Lines answered "error" (unknown outcomes: never certainly held).
    pub unknown_outcomes: u64,
    /// Episodes of certain over-admission, over every key.
    pub over_admissions: u64,
    /// The largest weight certainly held beyond a limit.
    pub largest_excess: u64,
    /// Admissions whose token went backwards.
    pub token_violations: u64,
    /// Admissions compared for tokens (of one key, with a token).
    pub tokens_compared: u64,
    /// Slots still held at the last status line of each key.
    pub slots_leaked: u64,
    /// Renewals answered "lost".
    pub permits_lost: u64,
    /// Each key, by name.
    pub keys: Vec<KeyReport>,
    /// The first tokens that went backwards.
    pub token_examples: Vec<TokenExample>,
    /// Each fault, by its end.
    pub faults: Vec<FaultReport>,
}

/// One key.
#[derive(Debug, Default, Serialize)]
pub struct KeyReport {
    /// The key.
    pub key: String,
    /// The largest limit a line reports (0: unlimited; null: none reported, so never checked).
    pub limit: Option<u32>,
    /// Acquires of it answered "admitted".
    pub admissions: u64,
    /// The most weight certainly held at once.
    pub peak_held: u64,
    /// Episodes of certain over-admission.
    pub over_admissions: u64,
    /// The largest weight certainly held beyond the limit.
    pub largest_excess: u64,
    /// `in_flight` of its last status line (null: no status line).
    pub leaked: Option<u32>,
    /// Renewals of it answered "lost".
    pub lost: u64,
    /// The first episodes, each at its peak.
    pub examples: Vec<ExcessExample>,
}

/// An instant of certain over-admission.
#[derive(Debug, Serialize)]
pub struct ExcessExample {
    /// When (ns since the Unix epoch).
    pub at_ns: u64,
    /// When, in ms since the history's first invoke.
    pub at_ms: f64,
    /// The weight certainly held then.
    pub held: u64,
    /// The key's limit.
    pub limit: u32,
    /// Who held it (at most 16).
    pub holders: Vec<ExampleLine>,
}

/// A line of a history, as examples name it.
#[derive(Debug, Serialize)]
pub struct ExampleLine {
    /// `file:line`.
    pub at: String,
    /// Its op.
    pub op: &'static str,
    /// Its process.
    pub process: String,
    /// Its permit id.
    pub id: String,
    /// Its weight (for a holder, the slot's).
    pub weight: u32,
    /// The token it names for the key, if any.
    pub token: Option<u64>,
    /// Its invoke, ms since the history's first invoke.
    pub invoke_ms: f64,
    /// Its complete, ms since the history's first invoke.
    pub complete_ms: f64,
}

/// An admission whose token went backwards.
#[derive(Debug, Serialize)]
pub struct TokenExample {
    /// The key.
    pub key: String,
    /// The admission.
    pub later: ExampleLine,
    /// The admission it came after, or the release or lost renewal that ended that one's lease.
    pub earlier: ExampleLine,
}

/// A fault, and how long admissions took to resume after it.
#[derive(Debug, Serialize)]
pub struct FaultReport {
    /// Which fault.
    pub name: String,
    /// Who logged it.
    pub process: String,
    /// When it began (ns since the Unix epoch).
    pub invoke_ns: u64,
    /// When it ended.
    pub complete_ns: u64,
    /// ms from its end to the first admission completed after (null: none).
    pub recovery_ms: Option<f64>,
}

/// The report of `history`, given what the checks found.
pub(crate) fn report(history: &History, keys: Vec<KeyCheck>, tokens: TokenCheck) -> Report {
    let start = history.start_ns();
    let ms = |ns| ms_after(start, ns);
    let name = |sym: Sym| history.names.get(sym).to_owned();
    let line = |n: u32, key: Option<Sym>, weight: Option<u32>| {
        let op = &history.ops[n as usize];
        let pos = key.and_then(|key| op.keys.iter().position(|k| *k == key));
        ExampleLine {
            at: format!("{}:{}", history.files[op.file as usize], op.line),
            op: op.kind.name(),
            process: name(op.process),
            id: name(op.id),
            weight: weight.unwrap_or(op.weight),
            token: pos.and_then(|pos| op.token(pos)),
            invoke_ms: ms(op.invoke_ns),
            complete_ms: ms(op.complete_ns),
        }
    };
    let mut by_key: BTreeMap<String, KeyReport> = BTreeMap::new();
    let mut report = Report {
        files: history.files.clone(),
        token_violations: tokens.count,
        tokens_compared: tokens.compared,
        ..Report::default()
    };
    let mut last_status: BTreeMap<Sym, (u64, usize)> = BTreeMap::new();
    let mut admitted: Vec<u64> = Vec::new();
    for (n, op) in history.ops.iter().enumerate() {
        if op.kind != Kind::Fault {
            report.operations += 1;
        }
        match (op.kind, op.outcome) {
            (_, Outcome::Error) => report.unknown_outcomes += 1,
            (Kind::Acquire, Outcome::Admitted) => {
                report.admissions += 1;
                admitted.push(op.complete_ns);
                for key in &op.keys {
                    keyed(&mut by_key, history, *key).admissions += 1;
                }
            }
            (Kind::Renew, Outcome::Lost) => {
                report.permits_lost += 1;
                for key in &op.keys {
                    keyed(&mut by_key, history, *key).lost += 1;
                }
            }
            (Kind::Status, _) => {
                for key in &op.keys {
                    let last = last_status.entry(*key).or_insert((op.complete_ns, n));
                    if op.complete_ns >= last.0 {
                        *last = (op.complete_ns, n);
                    }
                }
            }
            _ => {}
        }
    }
    for (key, (_, n)) in last_status {
        let op = &history.ops[n];
        let pos = op.keys.iter().position(|k| *k == key).expect("its key");
        let in_flight = op.in_flight[pos];
        report.slots_leaked += u64::from(in_flight);
        keyed(&mut by_key, history, key).leaked = Some(in_flight);
    }
    for check in keys {
        report.over_admissions += check.episodes;
        report.largest_excess = report.largest_excess.max(check.largest_excess);
        let key = keyed(&mut by_key, history, check.key);
        key.peak_held = check.peak;
        key.over_admissions = check.episodes;
        key.largest_excess = check.largest_excess;
        key.examples = check
            .examples
            .iter()
            .map(|example| ExcessExample {
                at_ns: example.at_ns,
                at_ms: ms(example.at_ns),
                held: example.held,
                limit: example.limit,
                holders: example
                    .holders
                    .iter()
                    .map(|&(n, weight)| line(n, Some(check.key), Some(weight)))
                    .collect(),
            })
            .collect();
    }
    report.keys = by_key.into_values().collect();
    report.token_examples = tokens
        .examples
        .iter()
        .map(|b| TokenExample {
            key: name(b.key),
            later: ExampleLine {
                token: Some(b.later_token),
                ..line(b.later, Some(b.key), None)
            },
            earlier: ExampleLine {
                token: Some(b.earlier_token),
                ..line(b.earlier, Some(b.key), None)
            },
        })
        .collect();
    admitted.sort_unstable();
    let mut faults: Vec<&Op> = history
        .ops
        .iter()
        .filter(|op| op.kind == Kind::Fault)
        .collect();
    faults.sort_by_key(|op| (op.complete_ns, op.invoke_ns));
    report.faults = faults
        .into_iter()
        .map(|fault| {
            let next = admitted.partition_point(|&at| at <= fault.complete_ns);
            FaultReport {
                name: name(fault.name),
                process: name(fault.process),
                invoke_ns: fault.invoke_ns,
                complete_ns: fault.complete_ns,
                recovery_ms: admitted
                    .get(next)
                    .map(|&at| ms_after(fault.complete_ns, at)),
            }
        })
        .collect();
    report.ok = report.over_admissions == 0 && report.token_violations == 0;
    report
}

/// The report of `key`, made when first needed.
fn keyed<'a>(
    by_key: &'a mut BTreeMap<String, KeyReport>,
    history: &History,
    key: Sym,
) -> &'a mut KeyReport {
    let name = history.names.get(key);
    if !by_key.contains_key(name) {
        let limit = history.limits.get(&key).map(|limit| match limit {
            Limit::Unlimited => 0,
            Limit::At(n) => *n,
        });
        let key = name.to_owned();
        by_key.insert(
            key.clone(),
            KeyReport {
                key,
                limit,
                ..KeyReport::default()
            },
        );
    }
    by_key.get_mut(name).expect("inserted")
}

/// `ns` as ms after `origin`, to the µs.
fn ms_after(origin: u64, ns: u64) -> f64 {
    (ns.saturating_sub(origin) / 1_000) as f64 / 1_000.0
}
