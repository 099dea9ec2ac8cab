//! History lines (docs/histories.md; [`Line`], the type the checker reads): one JSON object per
//! operation, appended to a file of the process's own, timed on one clock per process.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use inflight_history::Line;

/// Nanoseconds since the Unix epoch: the wall clock read once, advanced by the monotonic clock, so that
/// every line of a process is ordered and the processes of one machine are comparable.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    epoch_ns: u64,
    start: Instant,
}

impl Clock {
    /// Reads the wall clock now, between two readings of the monotonic clock close together (a
    /// process preempted between the two clocks would run its whole history off by the pause: a few
    /// ms on a loaded machine, enough for false alarms between processes).
    pub(crate) fn start() -> Self {
        let mut best: Option<(Duration, Self)> = None;
        for _ in 0..100 {
            let before = Instant::now();
            let wall = SystemTime::now();
            let after = Instant::now();
            let epoch_ns = wall
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            let gap = after - before;
            let clock = Self {
                epoch_ns,
                start: before + gap / 2,
            };
            if best.as_ref().is_none_or(|(g, _)| gap < *g) {
                best = Some((gap, clock));
            }
            if gap < Duration::from_micros(20) {
                break;
            }
        }
        best.map(|(_, clock)| clock).expect("at least one reading")
    }

    /// Now, in ns since the Unix epoch.
    pub(crate) fn now(&self) -> u64 {
        self.epoch_ns + self.start.elapsed().as_nanos() as u64
    }
}

/// One process's history file; each line is written with a single `write` (a SIGKILL never splits one).
#[derive(Debug)]
pub(crate) struct History {
    process: String,
    clock: Clock,
    file: Mutex<File>,
}

/// What a line says about a permit (and, from its keys, the limits the client knows).
#[derive(Debug, Clone)]
pub(crate) struct PermitInfo {
    pub(crate) keys: Vec<String>,
    pub(crate) id: String,
    pub(crate) weight: u32,
    pub(crate) lease_ms: u64,
}

impl History {
    /// Appends to `path` (created when missing) as `process`.
    pub(crate) fn open(path: &Path, process: &str) -> std::io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Self {
            process: process.to_owned(),
            clock: Clock::start(),
            file: Mutex::new(file),
        })
    }

    /// Now on this history's clock.
    pub(crate) fn now(&self) -> u64 {
        self.clock.now()
    }

    /// Appends `line` as this process's.
    fn write(&self, line: Line) {
        let line = Line {
            process: self.process.clone(),
            ..line
        };
        let mut text = serde_json::to_string(&line).expect("a line is JSON");
        text.push('\n');
        if let Ok(mut file) = self.file.lock() {
            // A line that cannot be written is a history that cannot be checked: stop loudly.
            file.write_all(text.as_bytes())
                .expect("write a history line");
        }
    }

    /// An operation on a permit: `op` ("acquire", "release", "renew") with its `result` and `token`.
    pub(crate) fn permit_op(
        &self,
        op: &str,
        permit: &PermitInfo,
        times: (u64, u64),
        result: &str,
        token: Option<u64>,
    ) {
        self.write(Line {
            op: op.into(),
            keys: permit.keys.clone(),
            id: Some(permit.id.clone()),
            token,
            weight: Some(permit.weight),
            lease_ms: Some(permit.lease_ms),
            limits: Some(permit.keys.iter().map(|k| Some(limit_of(k))).collect()),
            invoke_ns: times.0,
            complete_ns: times.1,
            result: result.into(),
            ..Line::default()
        });
    }

    /// A fault in force from `invoke_ns` to `complete_ns`.
    pub(crate) fn fault(&self, name: &str, invoke_ns: u64, complete_ns: u64) {
        self.write(Line {
            op: "fault".into(),
            name: Some(name.into()),
            invoke_ns,
            complete_ns,
            result: "ok".into(),
            ..Line::default()
        });
    }

    /// A key's in-flight count read at the end of a run.
    pub(crate) fn status(&self, key: &str, in_flight: u32, times: (u64, u64)) {
        self.write(Line {
            op: "status".into(),
            keys: vec![key.into()],
            in_flight: vec![in_flight],
            limits: Some(vec![Some(limit_of(key))]),
            invoke_ns: times.0,
            complete_ns: times.1,
            result: "ok".into(),
            ..Line::default()
        });
    }
}

/// The lines of the history at `path` that can be read.
pub(crate) fn lines(path: &Path) -> Vec<Line> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// Ends, in the history at `path` of a process SIGKILLed at `killed_ns`, every admitted permit it had not
/// logged a release of: a release it had sent may have landed, unlogged, so from the kill on (when it did
/// no more work) none is certainly held. Each gets a release with result "error" (unknown) at the kill.
pub(crate) fn end_killed(path: &Path, killed_ns: u64) -> std::io::Result<()> {
    let mut open: Vec<Line> = Vec::new();
    for line in lines(path) {
        match (line.op.as_str(), line.result.as_str()) {
            ("acquire", "admitted") => open.push(line),
            ("release", _) => open.retain(|held| held.id != line.id),
            _ => {}
        }
    }
    let mut out = String::new();
    for held in open {
        let release = Line {
            op: "release".into(),
            result: "error".into(),
            token: None,
            invoke_ns: killed_ns,
            complete_ns: killed_ns,
            ..held
        };
        out.push_str(&serde_json::to_string(&release).expect("a line is JSON"));
        out.push('\n');
    }
    OpenOptions::new()
        .append(true)
        .open(path)?
        .write_all(out.as_bytes())
}

/// The limit of a key of a run: the number between `l` and `:` of its name (`l4:a` has 4), 0 otherwise.
pub(crate) fn limit_of(key: &str) -> u32 {
    key.strip_prefix('l')
        .and_then(|rest| rest.split(':').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_killed_holders_unreleased_permits_end_at_the_kill() {
        let path = std::env::temp_dir().join(format!("chaos-killed-{}.jsonl", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let history = History::open(&path, "rust-0").unwrap();
        let permit = |id: &str| PermitInfo {
            keys: vec!["l1:a".into()],
            id: id.into(),
            weight: 1,
            lease_ms: 2000,
        };
        history.permit_op("acquire", &permit("a"), (1, 2), "admitted", Some(7));
        history.permit_op("release", &permit("a"), (3, 4), "released", None);
        history.permit_op("acquire", &permit("a"), (5, 6), "admitted", Some(8));
        history.permit_op("acquire", &permit("b"), (5, 6), "full", None);
        end_killed(&path, 10).unwrap();
        let added = lines(&path).split_off(4);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(added.len(), 1, "only the second admission of a was open");
        let line = &added[0];
        assert_eq!((&*line.op, line.id.as_deref()), ("release", Some("a")));
        assert_eq!(
            (&*line.result, line.invoke_ns, line.token),
            ("error", 10, None)
        );
    }

    #[test]
    fn a_keys_limit_is_in_its_name() {
        assert_eq!(limit_of("l4:a"), 4);
        assert_eq!(limit_of("l64:b"), 64);
        assert_eq!(limit_of("free"), 0);
    }
}
