//! What the topologies share: free ports, redis-server processes in a directory of their own, and a
//! watchdog that kills them when the test process ends without dropping them (a topology in a
//! `static`, a test aborted).
//!
//! The server is `redis-server` from the PATH, or the one `INFLIGHT_REDIS_SERVER` names (a path), for
//! runs against another Redis version (`scripts/test.sh` runs the Redis tests on Redis 6.2 that way);
//! `redis-cli` is the one beside it when there is one.

use std::ffi::OsString;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// `n` distinct free ports on 127.0.0.1 whose cluster bus port (`port + 10000`) is free as well.
pub fn free_ports(n: usize) -> Vec<u16> {
    let mut held = Vec::new();
    let mut ports = Vec::new();
    while ports.len() < n {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
        let port = listener.local_addr().expect("its address").port();
        if port > 55_000 {
            continue;
        }
        let Ok(bus) = TcpListener::bind(("127.0.0.1", port + 10_000)) else {
            continue;
        };
        held.push((listener, bus));
        ports.push(port);
    }
    ports
}

/// `127.0.0.1:<port>` of each port, joined with commas (for a URL of several nodes).
pub fn addrs(ports: &[u16]) -> String {
    let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    addrs.join(",")
}

/// The flags of a replication that starts at once (diskless, no delay).
pub const FAST_SYNC: [&str; 4] = [
    "--repl-diskless-sync",
    "yes",
    "--repl-diskless-sync-delay",
    "0",
];

/// A fresh directory under the system's temporary directory.
pub fn scratch_dir(kind: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "inflight-{kind}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("make a scratch directory");
    dir
}

/// The redis-server to run: `INFLIGHT_REDIS_SERVER` (a path) if set, else `redis-server` from the PATH.
pub fn server_bin() -> OsString {
    std::env::var_os("INFLIGHT_REDIS_SERVER")
        .filter(|path| !path.is_empty())
        .unwrap_or_else(|| "redis-server".into())
}

/// The redis-cli to run: the one beside `INFLIGHT_REDIS_SERVER` if there is one (the same version),
/// else `redis-cli` from the PATH.
pub fn cli_bin() -> OsString {
    std::env::var_os("INFLIGHT_REDIS_SERVER")
        .map(PathBuf::from)
        .and_then(|server| Some(server.parent()?.join("redis-cli")))
        .filter(|cli| cli.is_file())
        .map_or_else(|| "redis-cli".into(), PathBuf::into_os_string)
}

/// The version of [`server_bin`] (`redis-server --version`: `... v=7.0.15 ...`), asked once.
pub fn server_version() -> (u32, u32, u32) {
    static VERSION: OnceLock<(u32, u32, u32)> = OnceLock::new();
    *VERSION.get_or_init(|| {
        let bin = server_bin();
        let out = Command::new(&bin)
            .arg("--version")
            .output()
            .unwrap_or_else(|e| panic!("run {bin:?} --version (is redis-server installed?): {e}"));
        let text = String::from_utf8_lossy(&out.stdout);
        parse_version(&text).unwrap_or_else(|| panic!("no version in {bin:?} --version: {text}"))
    })
}

/// `X.Y.Z` after `v=` in `redis-server --version`'s output.
fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let version = text.split_once(" v=")?.1.split_whitespace().next()?;
    let mut parts = version.split('.').map(|part| part.parse::<u32>().ok());
    Some((
        parts.next()??,
        parts.next()??,
        parts.next().flatten().unwrap_or(0),
    ))
}

/// The arguments that let DEBUG run (from 127.0.0.1) with `setting` (`local` or `yes`): Redis 7 asks
/// for `enable-debug-command`; Redis 6 always allows DEBUG and does not know the setting.
pub fn debug_command_args(setting: &'static str) -> Vec<&'static str> {
    if server_version().0 >= 7 {
        vec!["--enable-debug-command", setting]
    } else {
        Vec::new()
    }
}

/// Starts the redis-server ([`server_bin`]) with `args` (after a config file, if any), logging to
/// `dir/<port>.log`.
pub fn spawn_server(dir: &Path, port: u16, config: Option<&Path>, args: &[&str]) -> Child {
    let mut cmd = Command::new(server_bin());
    if let Some(config) = config {
        cmd.arg(config);
    }
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join(format!("{port}.log")))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd.spawn().expect("start redis-server (is it installed?)")
}

/// A plain connection to one server.
pub fn connect(port: u16) -> redis::RedisResult<redis::Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let conn = client.get_connection_with_timeout(Duration::from_millis(300))?;
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    Ok(conn)
}

/// Waits (up to `within`) until `check` is true, panicking with `what` otherwise.
pub fn wait_until(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the server on `port` answers PING.
pub fn wait_ping(port: u16) {
    wait_until(Duration::from_secs(10), "redis-server answers PING", || {
        connect(port)
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
            .is_ok()
    });
}

/// One field of `INFO section` (or of `CLUSTER INFO`, for the section `cluster`) of the server on
/// `port`.
pub fn info_field(port: u16, section: &str, field: &str) -> Option<String> {
    let (name, arg) = match section {
        "cluster" => ("CLUSTER", "INFO"),
        _ => ("INFO", section),
    };
    let info: String = redis::cmd(name)
        .arg(arg)
        .query(&mut connect(port).ok()?)
        .ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .map(|value| value.trim().to_owned())
}

/// Kills `child` with SIGKILL and reaps it.
pub fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// A topology's redis-server processes in a scratch directory of their own, each known by its port,
/// watched from the start and killed when dropped.
pub struct Nodes {
    /// Their directory: configs, data and a log per node (`<port>.log`).
    pub dir: PathBuf,
    children: Mutex<Vec<(u16, Option<Child>)>>,
    /// Kills them when the test process ends, however it ends (a topology in a `static`, a test
    /// aborted): a shell that reads their pids on its stdin, a pipe only this process writes to, and at
    /// EOF (this process gone, or the nodes dropped) kills them and removes their directory.
    watchdog: Child,
}

impl Nodes {
    /// None yet, in a fresh scratch directory for `kind`, with the watchdog that kills them.
    pub fn new(kind: &str) -> Self {
        let dir = scratch_dir(kind);
        let script = format!(
            "pids=''; while read -r pid; do pids=\"$pids $pid\"; done; \
             [ -n \"$pids\" ] && kill -9 $pids 2>/dev/null; rm -rf '{}'",
            dir.display()
        );
        let watchdog = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the watchdog shell");
        Self {
            dir,
            children: Mutex::default(),
            watchdog,
        }
    }

    /// Starts a server on `port`, as [`spawn_server`] does.
    pub fn spawn(&self, port: u16, config: Option<&Path>, args: &[&str]) {
        let child = spawn_server(&self.dir, port, config, args);
        if let Some(mut stdin) = self.watchdog.stdin.as_ref() {
            let _ = writeln!(stdin, "{}", child.id());
        }
        self.children.lock().unwrap().push((port, Some(child)));
    }

    /// Kills the node on `port` with SIGKILL (its data is gone with it); [`Nodes::spawn`] may start
    /// another on the same port after.
    pub fn kill(&self, port: u16) {
        let mut children = self.children.lock().unwrap();
        let mut on_port = children.iter_mut().filter(|(p, _)| *p == port);
        if let Some(mut child) = on_port.find_map(|(_, child)| child.take()) {
            kill(&mut child);
        }
    }

    /// The process id of the live node on `port` (to pause it with SIGSTOP, say).
    pub fn pid(&self, port: u16) -> Option<u32> {
        let children = self.children.lock().unwrap();
        children
            .iter()
            .find_map(|(p, child)| child.as_ref().filter(|_| *p == port).map(Child::id))
    }

    /// The ports of the nodes not killed, in the order they were started.
    pub fn live(&self) -> Vec<u16> {
        let children = self.children.lock().unwrap();
        children
            .iter()
            .filter(|(_, child)| child.is_some())
            .map(|(port, _)| *port)
            .collect()
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        let children = self.children.get_mut().unwrap();
        for child in children.iter_mut().filter_map(|(_, child)| child.as_mut()) {
            kill(child);
        }
        // EOF: the watchdog removes the directory now.
        self.watchdog.stdin.take();
        let _ = self.watchdog.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::parse_version;

    #[test]
    fn versions_are_read_from_redis_server_version() {
        let v6 = "Redis server v=6.2.14 sha=40305114:0 malloc=libc bits=64 build=dff95a8e7a99d269";
        assert_eq!(parse_version(v6), Some((6, 2, 14)));
        let v7 = "Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=ae4d7c9";
        assert_eq!(parse_version(v7), Some((7, 0, 15)));
        assert_eq!(parse_version("Redis server v=8.0 sha=0"), Some((8, 0, 0)));
        assert_eq!(parse_version("no version here"), None);
    }
}
