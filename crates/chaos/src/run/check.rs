//! What a scenario's histories say beyond the checker's report (inflight-history, run in process): the
//! keys over a bound, the fault's length and the longest recovery after it.

use inflight_history::Report;

/// The keys over their limit by more than `allowed(key's limit)`.
pub(crate) fn keys_over(report: &Report, allowed: impl Fn(u64) -> u64) -> Vec<String> {
    let keys = report.keys.iter();
    let over = keys.filter(|key| key.largest_excess > allowed(key.limit.unwrap_or(0).into()));
    over.map(|key| key.key.clone()).collect()
}

/// The longest recovery after a fault, in ms to the tenth (none when no admission followed one).
pub(crate) fn recovery_ms(report: &Report) -> Option<f64> {
    let faults = report.faults.iter();
    let longest = faults.filter_map(|f| f.recovery_ms).reduce(f64::max)?;
    Some((longest * 10.0).round() / 10.0)
}

/// How long the fault was in force, in ms (the runner's fault line).
pub(crate) fn fault_ms(report: &Report) -> Option<u64> {
    let faults = report.faults.iter();
    faults
        .map(|f| f.complete_ns.saturating_sub(f.invoke_ns) / 1_000_000)
        .max()
}
