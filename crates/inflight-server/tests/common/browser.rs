//! Headless Chromium (Debian's `chromium`) for tests of pages: each run bounded in time and killed past it,
//! with a profile of its own; a page read once it is done (`--dump-dom`), or a [`Tab`] a test clicks.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

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

/// How long one step of a [`Tab`] may take: an answer of the browser, or a condition to come true.
const STEP: Duration = Duration::from_secs(20);

/// Headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: it reads
/// commands on its fd 3 and answers on its fd 4, which a shell points at the child's stdin and stdout),
/// with one tab, whose page a test reads (JavaScript evaluated) and clicks (mouse events at an
/// element). Each step is bounded by [`STEP`]; the browser is killed when dropped.
pub struct Tab {
    child: tokio::process::Child,
    commands: tokio::process::ChildStdin,
    answers: tokio::io::BufReader<tokio::process::ChildStdout>,
    /// The tab's session (commands to the page carry it).
    session: String,
    last_id: u64,
    /// The `Authorization` that requests [`Tab::authorize`] names are sent with.
    authorization: Option<String>,
    _profile: tempfile::TempDir,
}

impl Tab {
    /// A browser with one blank tab.
    pub async fn start(chromium: &Path) -> Self {
        use tokio::process::Command;
        let profile = tempfile::tempdir().unwrap();
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(r#"exec "$0" "$@" 3<&0 4>&1 </dev/null >/dev/null"#)
            .arg(chromium)
            .args([
                "--headless=new",
                "--disable-gpu",
                "--no-sandbox",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-dev-shm-usage",
                "--window-size=1280,1000",
                "--remote-debugging-pipe",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromium starts");
        let mut tab = Self {
            commands: child.stdin.take().unwrap(),
            answers: tokio::io::BufReader::new(child.stdout.take().unwrap()),
            child,
            session: String::new(),
            last_id: 0,
            authorization: None,
            _profile: profile,
        };
        let target = tab
            .call(false, "Target.createTarget", json!({"url": "about:blank"}))
            .await;
        let attach = json!({"targetId": target["targetId"], "flatten": true});
        let attached = tab.call(false, "Target.attachToTarget", attach).await;
        tab.session = attached["sessionId"].as_str().unwrap().to_owned();
        tab
    }

    /// From now on, requests to URLs matching `pattern` (`*` any run of characters) are sent with
    /// `Authorization: authorization`, as a proxy in front of the server might add it: the page's
    /// script cannot read it.
    pub async fn authorize(&mut self, pattern: &str, authorization: &str) {
        self.authorization = Some(authorization.to_owned());
        let patterns = json!({"patterns": [{"urlPattern": pattern, "requestStage": "Request"}]});
        self.call(true, "Fetch.enable", patterns).await;
    }

    /// Loads `url` in the tab (the page's script may still be starting).
    pub async fn goto(&mut self, url: &str) {
        let navigated = self.call(true, "Page.navigate", json!({"url": url})).await;
        assert!(navigated.get("errorText").is_none(), "{url}: {navigated}");
    }

    /// The value of `expression` in the page (a promise's, once settled).
    pub async fn eval(&mut self, expression: &str) -> Value {
        let params = json!({"expression": expression, "returnByValue": true, "awaitPromise": true});
        let evaluated = self.call(true, "Runtime.evaluate", params).await;
        if let Some(exception) = evaluated.get("exceptionDetails") {
            panic!("{expression}: {exception}");
        }
        evaluated["result"]["value"].clone()
    }

    /// The value of `expression` once it is truthy, asked every 50 ms for at most [`STEP`]; a panic
    /// naming `what` past that.
    pub async fn wait_for(&mut self, expression: &str, what: &str) -> Value {
        let deadline = Instant::now() + STEP;
        loop {
            let value = self.eval(expression).await;
            let truthy = match &value {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::String(s) => !s.is_empty(),
                Value::Array(_) | Value::Object(_) => true,
            };
            if truthy {
                return value;
            }
            if Instant::now() > deadline {
                let page = self.eval("document.body.innerText").await;
                panic!(
                    "not {what} within {STEP:?} ({expression} is {value}); the page shows: {page}"
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A click of the left button at the middle of the element `element` (a JavaScript expression)
    /// evaluates to, once there is one and nothing covers its middle (scrolled into view).
    pub async fn click(&mut self, element: &str, what: &str) {
        let place = format!(
            "(function () {{ var el = {element}; if (!el) return null; \
             el.scrollIntoView({{block: 'center'}}); var r = el.getBoundingClientRect(); \
             var x = r.left + r.width / 2, y = r.top + r.height / 2; \
             var hit = document.elementFromPoint(x, y); \
             return hit && (hit === el || el.contains(hit)) ? [x, y] : null; }})()"
        );
        let at = self.wait_for(&place, &format!("{what} to click")).await;
        let (x, y) = (at[0].clone(), at[1].clone());
        for kind in ["mouseMoved", "mousePressed", "mouseReleased"] {
            let mouse = json!({"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1});
            self.call(true, "Input.dispatchMouseEvent", mouse).await;
        }
    }

    /// Closes the browser (killed if it is still running 10 s later).
    pub async fn close(mut self) {
        self.last_id += 1;
        self.send(self.last_id, false, "Browser.close", json!({}))
            .await;
        let exited = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
        if exited.is_err() {
            let _ = self.child.kill().await;
        }
    }

    /// Sends a command (to the tab when `to_tab`) and waits for its result, seeing to requests
    /// [`Tab::authorize`] holds meanwhile.
    async fn call(&mut self, to_tab: bool, method: &str, params: Value) -> Value {
        self.last_id += 1;
        let id = self.last_id;
        self.send(id, to_tab, method, params).await;
        let deadline = tokio::time::Instant::now() + STEP;
        loop {
            let mut bytes = Vec::new();
            let read = tokio::time::timeout_at(deadline, self.answers.read_until(0, &mut bytes))
                .await
                .unwrap_or_else(|_| panic!("chromium did not answer {method} within {STEP:?}"))
                .expect("read from chromium");
            assert!(
                read > 0 && bytes.pop() == Some(0),
                "chromium closed its pipe"
            );
            let message: Value = serde_json::from_slice(&bytes).unwrap();
            if message["id"] == id {
                if let Some(error) = message.get("error") {
                    panic!("{method}: {error}");
                }
                return message["result"].clone();
            }
            if message["method"] == "Fetch.requestPaused" {
                self.continue_authorized(&message["params"]).await;
            }
        }
    }

    /// Lets a request held by `Fetch.enable` go on, with the `Authorization` of [`Tab::authorize`].
    async fn continue_authorized(&mut self, paused: &Value) {
        let mut headers: Vec<Value> = paused["request"]["headers"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(name, _)| !name.eq_ignore_ascii_case("authorization"))
            .map(|(name, value)| json!({"name": name, "value": value}))
            .collect();
        if let Some(authorization) = &self.authorization {
            headers.push(json!({"name": "Authorization", "value": authorization}));
        }
        let go_on = json!({"requestId": paused["requestId"], "headers": headers});
        self.last_id += 1;
        // (Its answer, unawaited, is passed over by `call`.)
        self.send(self.last_id, true, "Fetch.continueRequest", go_on)
            .await;
    }

    async fn send(&mut self, id: u64, to_tab: bool, method: &str, params: Value) {
        let mut message = json!({"id": id, "method": method, "params": params});
        if to_tab {
            message["sessionId"] = json!(self.session);
        }
        let mut bytes = serde_json::to_vec(&message).unwrap();
        bytes.push(0);
        tokio::time::timeout(STEP, self.commands.write_all(&bytes))
            .await
            .unwrap_or_else(|_| panic!("chromium did not take {method} within {STEP:?}"))
            .expect("write to chromium");
    }
}
