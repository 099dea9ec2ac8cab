//! Headless Chromium (Debian's `chromium`) for tests of pages: each run bounded in time and killed past it,
//! with a profile of its own.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Debian's Chromium, or `None` (the test is skipped, saying so) when it is not installed outside CI;
/// in CI (`CI=true`) its absence fails the test.
pub fn chromium() -> Option<PathBuf> {
    let given = std::env::var_os("CHROMIUM").map(PathBuf::from);
    let found = given
        .into_iter()
        .chain(["/usr/bin/chromium", "/usr/bin/chromium-browser"].map(PathBuf::from))
        .find(|path| path.exists());
    if found.is_none() {
        assert!(
            std::env::var("CI").map_or(true, |ci| ci != "true"),
            "CI=true but chromium is not installed (apt-get install chromium)"
        );
        eprintln!("SKIPPED: chromium is not installed (apt-get install chromium); the status page was not tried in a browser");
    }
    found
}

/// Runs headless Chromium on `url` with `args`, killed after `bound`; its stdout.
pub fn run_chromium(chromium: &Path, args: &[&str], url: &str, bound: Duration) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new(chromium)
        .args([
            "--headless=new",
            "--disable-gpu",
            "--no-sandbox",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-dev-shm-usage",
            "--virtual-time-budget=15000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium starts");
    let started = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > bound {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium ran past {bound:?} on {url}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    out
}

/// [`run_chromium`] off the runtime's threads, bounded to a minute.
pub fn browse(
    chromium: &Path,
    args: &[&str],
    url: String,
) -> impl std::future::Future<Output = String> + Send + 'static {
    let (chromium, args) = (
        chromium.to_owned(),
        args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>(),
    );
    let run = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_chromium(&chromium, &args, &url, Duration::from_secs(60))
    });
    async move { run.await.unwrap() }
}
