//! The `inflight` binary's settings: flags > environment > file > defaults, the Dify aliases, bad values
//! named, secrets never logged, SIGTERM handled. Runs the real binary.
#![allow(missing_docs)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::process::{listen_of, Running};

/// Runs `inflight ARGS` with only `env` set (plus PATH); returns its start line, or its failure output.
fn start(args: &[&str], env: &[(&str, &str)]) -> Result<String, String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_inflight"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run inflight");
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    for line in stderr.lines() {
        let line = line.unwrap();
        if line.contains("inflight started") {
            child.kill().unwrap();
            child.wait().unwrap();
            return Ok(line);
        }
        seen.push_str(&line);
        seen.push('\n');
    }
    let status = child.wait().unwrap();
    assert!(
        !status.success(),
        "inflight exited 0 without starting: {seen}"
    );
    Err(seen)
}

fn serve(args: &[&str], env: &[(&str, &str)]) -> Result<String, String> {
    let mut all = vec!["serve", "--listen", "127.0.0.1:0"];
    all.extend_from_slice(args);
    start(&all, env)
}

fn file(contents: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::io::Write::write_all(&mut file, contents.as_bytes()).unwrap();
    file
}

#[test]
fn the_defaults_are_the_embedded_store_and_no_limits() {
    let line = serve(&[], &[]).unwrap();
    for want in [
        "command=\"serve\"",
        "store=memory://",
        "default_limit=0",
        "max_limit=0",
        "lease=30s",
    ] {
        assert!(line.contains(want), "{want} in {line}");
    }
}

#[test]
fn flags_beat_the_environment_which_beats_the_file() {
    let toml = file("default_limit = 2\nmax_limit = 20\nlease = \"10s\"\n");
    let path = toml.path().to_str().unwrap();
    let line = serve(&["--config", path], &[]).unwrap();
    assert!(
        line.contains("default_limit=2")
            && line.contains("max_limit=20")
            && line.contains("lease=10s"),
        "{line}"
    );
    let line = serve(&["--config", path], &[("INFLIGHT_DEFAULT_LIMIT", "3")]).unwrap();
    assert!(
        line.contains("default_limit=3") && line.contains("max_limit=20"),
        "{line}"
    );
    let line = serve(
        &["--config", path, "--default-limit", "4"],
        &[("INFLIGHT_DEFAULT_LIMIT", "3")],
    )
    .unwrap();
    assert!(line.contains("default_limit=4"), "{line}");
    let line = serve(
        &[],
        &[("INFLIGHT_CONFIG", path), ("INFLIGHT_LEASE", "750ms")],
    )
    .unwrap();
    assert!(
        line.contains("default_limit=2") && line.contains("lease=750ms"),
        "{line}"
    );
}

#[test]
fn difys_variables_carry_over_when_inflights_are_unset() {
    let dify = [
        ("APP_DEFAULT_ACTIVE_REQUESTS", "7"),
        ("APP_MAX_ACTIVE_REQUESTS", "9"),
    ];
    let line = serve(&[], &dify).unwrap();
    assert!(
        line.contains("default_limit=7") && line.contains("max_limit=9"),
        "{line}"
    );
    let both = [dify[0], dify[1], ("INFLIGHT_DEFAULT_LIMIT", "3")];
    let line = serve(&[], &both).unwrap();
    assert!(
        line.contains("default_limit=3") && line.contains("max_limit=9"),
        "{line}"
    );
    // They are environment: they beat the file too.
    let toml = file("default_limit = 2\n");
    let line = serve(&["--config", toml.path().to_str().unwrap()], &dify).unwrap();
    assert!(line.contains("default_limit=7"), "{line}");
}

#[test]
fn a_bad_value_names_its_setting_and_exits_non_zero() {
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        (vec![], vec![("INFLIGHT_LEASE", "soon")], "lease"),
        (vec!["--lease", "10ms"], vec![], "lease"),
        (vec!["--default-limit", "many"], vec![], "default-limit"),
        (vec![], vec![("INFLIGHT_MAX_LIMIT", "-1")], "max-limit"),
        (
            vec![],
            vec![("APP_DEFAULT_ACTIVE_REQUESTS", "lots")],
            "APP_DEFAULT_ACTIVE_REQUESTS",
        ),
        (vec!["--store", "ftp://x"], vec![], "store"),
        (vec!["--store", "redis://[::1"], vec![], "store"),
        (vec!["--listen", "everywhere"], vec![], "listen"),
        (vec!["--workers", "0"], vec![], "workers"),
        (vec!["--redis-pipeline", "0"], vec![], "redis_pipeline"),
        (
            vec!["--redis-wait-replicas", "1", "--redis-wait-timeout", "0s"],
            vec![],
            "redis_wait_timeout",
        ),
        (
            vec![],
            vec![("INFLIGHT_REDIS_WAIT_REPLICAS", "some")],
            "redis-wait-replicas",
        ),
        (
            vec![],
            vec![("INFLIGHT_REDIS_PIPELINE", "65")],
            "redis_pipeline",
        ),
        (vec![], vec![("INFLIGHT_WORKERS", "many")], "workers"),
        (
            vec!["--on-store-failure", "shrug"],
            vec![],
            "on_store_failure",
        ),
        (
            vec!["--config", "/nonexistent/inflight.toml"],
            vec![],
            "config",
        ),
    ];
    for (args, env, setting) in cases {
        let err = serve(&args, &env).expect_err(setting);
        assert!(err.contains(setting), "{setting} not named in: {err}");
    }
    let toml = file("default_limit = \"x\"\n");
    let err = serve(&["--config", toml.path().to_str().unwrap()], &[]).unwrap_err();
    assert!(err.contains("default_limit"), "{err}");
    let err = start(
        &[
            "proxy",
            "--admin-listen",
            "127.0.0.1:0",
            "--upstream",
            "http://127.0.0.1:9",
            "--config",
            toml.path().to_str().unwrap(),
        ],
        &[],
    )
    .unwrap_err();
    assert!(
        err.contains("default_limit"),
        "the proxy names it too: {err}"
    );
    let toml = file("defualt_limit = 3\n");
    let err = serve(&["--config", toml.path().to_str().unwrap()], &[]).unwrap_err();
    assert!(
        err.contains("defualt_limit"),
        "a misspelt setting is refused: {err}"
    );
    let err = start(&["proxy", "--listen", "127.0.0.1:0"], &[]).unwrap_err();
    assert!(err.contains("upstream"), "{err}");
    let err = start(&["proxy", "--upstream", "https://api.example"], &[]).unwrap_err();
    assert!(err.contains("upstream"), "{err}");
}

/// The scheduling policy is the operator's (`chrt --batch 0 inflight ...`), not a setting.
#[test]
fn sched_batch_is_no_longer_a_setting() {
    let err = serve(&["--sched-batch", "true"], &[]).unwrap_err();
    assert!(err.contains("--sched-batch"), "{err}");
    let toml = file("sched_batch = true\n");
    let err = serve(&["--config", toml.path().to_str().unwrap()], &[]).unwrap_err();
    assert!(err.contains("sched_batch"), "{err}");
}

#[test]
fn secrets_never_reach_the_log() {
    let line = serve(
        &[
            "--store",
            "redis://:hunter2@127.0.0.1:1/0",
            "--admin-token",
            "tok3n",
        ],
        &[],
    )
    .unwrap();
    assert!(
        !line.contains("hunter2") && !line.contains("tok3n"),
        "{line}"
    );
    assert!(line.contains("***@127.0.0.1:1/0"), "{line}");
}

#[test]
fn sigterm_stops_the_server_gracefully() {
    let (mut server, _) = Running::start(&["serve", "--listen", "127.0.0.1:0"]);
    server.signal("-TERM");
    let exit = server.wait_for(Duration::from_secs(5));
    assert!(exit.success(), "{exit:?}");
    let rest = server.rest_of_log();
    assert!(rest.iter().any(|l| l.contains("shutting down")), "{rest:?}");
}

#[test]
fn workers_share_one_address_that_no_other_server_can_take() {
    let line = serve(&["--workers", "3"], &[]).unwrap();
    assert!(line.contains("workers=3"), "{line}");
    let (_first, started) = Running::start(&["serve", "--listen", "127.0.0.1:0", "--workers", "2"]);
    let listen = listen_of(&started);
    // The first server's sockets share their port with each other, not with a server started after it.
    let err = start(&["serve", "--listen", &listen, "--workers", "2"], &[])
        .expect_err("a second server on a taken address");
    assert!(err.contains("cannot listen on"), "{err}");
}

#[cfg(target_os = "linux")]
#[test]
fn a_log_that_cannot_be_written_does_not_stop_the_server() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let mut server = Running::spawn(
        Command::new(env!("CARGO_BIN_EXE_inflight"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--default-limit", "7919"]) // tells its answers from another test's server's
            .env_clear()
            .stderr(Stdio::from(full)),
    );
    let started = Instant::now();
    // The port was free a moment ago; until this server answers on it, another test's may have it.
    let answered = loop {
        use std::io::{Read, Write};
        let mut answer = String::new();
        if let Ok(mut tcp) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            tcp.write_all(b"GET /v1/keys/k HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .unwrap();
            let _ = tcp.read_to_string(&mut answer);
        }
        if answer.contains("7919") {
            break answer;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the server never answered: {answer}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
    assert!(server.is_running(), "the server died writing its log");
    server.signal("-TERM");
    let exit = server.wait_for(Duration::from_secs(10));
    assert!(exit.success(), "{exit:?}");
}

fn proxy(args: &[&str], env: &[(&str, &str)]) -> Result<String, String> {
    start(
        &common::process::proxy_args("http://127.0.0.1:9", args),
        env,
    )
}

#[test]
fn bad_key_templates_and_proxy_scoping_name_their_setting() {
    let seventeen: Vec<&str> = ["--key", "k"].repeat(17);
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec!["--key", "t:{header:}"],
            vec![],
            "`key`",
            "empty header name",
        ),
        (
            vec!["--key", "t:{tenant}"],
            vec![],
            "`key`",
            "unknown placeholder",
        ),
        (
            vec!["--key", "t:{header:X-Tenant"],
            vec![],
            "`key`",
            "without its `}`",
        ),
        (vec!["--key", "t:}"], vec![], "`key`", "without its `{`"),
        (seventeen, vec![], "`key`", "at most 16"),
        // In the variable, commas separate templates: the bad one is named alone.
        (
            vec![],
            vec![("INFLIGHT_KEY", "global,t:{bogus}")],
            "`key`",
            "\"t:{bogus}\"",
        ),
        (
            vec!["--key-header", "X Bad"],
            vec![],
            "`key_header`",
            "not a header name",
        ),
        (
            vec!["--on-missing-key", "shrug"],
            vec![],
            "`on_missing_key`",
            "reject or pass",
        ),
        (
            vec!["--limit-path", "v1/chat"],
            vec![],
            "`limit_path`",
            "v1/chat",
        ),
        (
            vec!["--limit-path", "/v1/../admin"],
            vec![],
            "`limit_path`",
            "..",
        ),
    ];
    for (args, env, setting, why) in cases {
        let err = proxy(&args, &env).expect_err(setting);
        assert!(
            err.contains(setting) && err.contains(why),
            "{args:?} {env:?}: {err}"
        );
    }
    let toml = file("key = [\"tenant:{header:X-Tenant-Id}\", \"{nope}\"]\n");
    let err = proxy(&["--config", toml.path().to_str().unwrap()], &[]).unwrap_err();
    assert!(err.contains("`key`") && err.contains("{nope}"), "{err}");
}

#[test]
fn key_templates_and_limit_paths_come_from_the_file_flags_or_environment() {
    let toml = file(concat!(
        "key = [\"tenant:{header:X-Tenant-Id}\", \"app:{header:X-App-Id}\", \"global\"]\n",
        "limit_path = [\"/v1/chat-messages\", \"/v1/workflows/run\"]\n",
        "on_missing_key = \"pass\"\n",
    ));
    let path = toml.path().to_str().unwrap();
    proxy(&["--config", path], &[]).unwrap();
    let env = [
        ("INFLIGHT_KEY", "user:{bearer_hash},route:{path}"),
        (
            "INFLIGHT_LIMIT_PATH",
            "/v1/chat-messages,/v1/completion-messages",
        ),
    ];
    proxy(&[], &env).unwrap();
    use inflight_server::config::Layered;
    let flags = [
        "inflight",
        "--upstream",
        "http://127.0.0.1:9",
        "--key",
        "a:{header:X-A},b",
        "--key",
        "c",
    ];
    let settings = inflight_server::ProxySettings::from_flags(flags).unwrap();
    assert_eq!(
        settings.key,
        ["a:{header:X-A}", "b", "c"],
        "commas separate templates"
    );
    assert_eq!(settings.on_missing_key, "reject", "the default");
}

#[test]
fn classes_of_keys_come_from_flags_the_environment_or_the_file() {
    use inflight::Limit;
    use inflight_server::config::{Layered, LimitRule};
    use inflight_server::Settings;
    assert_eq!(
        LimitRule::parse("tenant:*=50,max=200"),
        Ok(LimitRule {
            keys: "tenant:*".into(),
            default: 50,
            max: 200
        })
    );
    assert_eq!(
        LimitRule::parse("app:*=max=9"),
        Ok(LimitRule {
            keys: "app:*".into(),
            default: 0,
            max: 9
        })
    );
    for bad in ["tenant:*", "a=x", "a=1,min=2", "a=1,2"] {
        assert!(LimitRule::parse(bad).is_err(), "{bad}");
    }
    let flags = [
        "inflight",
        "--limit",
        "tenant:*=50,max=200",
        "--limit",
        "app:*=5",
    ];
    let policy = Settings::from_flags(flags).unwrap().policy().unwrap();
    assert_eq!(policy.resolve("tenant:t1", Some(500)), Limit::Limited(200));
    assert_eq!(policy.resolve("app:a1", None), Limit::Limited(5));
    assert_eq!(policy.resolve("other", None), Limit::Unlimited);

    let toml = file(
        "default_limit = 0\nmax_limit = 0\n\
         [[limits]]\nkeys = \"tenant:*\"\ndefault = 50\nmax = 200\n\
         [[limits]]\nkeys = \"app:*\"\ndefault = 5\n\
         [[limits]]\nkeys = \"global\"\ndefault = 1000\n",
    );
    let path = toml.path().to_str().unwrap();
    let policy = Settings::from_flags(["inflight", "--config", path])
        .unwrap()
        .policy()
        .unwrap();
    assert_eq!(policy.rules().len(), 3);
    assert_eq!(policy.resolve("global", None), Limit::Limited(1000));
    assert_eq!(policy.resolve("tenant:t", None), Limit::Limited(50));
    // Flags replace the file's rules.
    let flags = ["inflight", "--config", path, "--limit", "app:*=7"];
    let policy = Settings::from_flags(flags).unwrap().policy().unwrap();
    assert_eq!(policy.rules().len(), 1);
    assert_eq!(policy.resolve("app:a", None), Limit::Limited(7));

    // The running server reports a class's limit, and the environment gives rules too.
    let line = serve(&[], &[("INFLIGHT_LIMITS", "app:*=5;tenant:*=50,max=200")]).unwrap();
    assert!(line.contains("rules=2"), "{line}");
    // Bad rules name the setting.
    let err = serve(&["--limit", "app:*"], &[]).unwrap_err();
    assert!(err.contains("limit"), "{err}");
    let twice = serve(&["--limit", "a=1", "--limit", "a=2"], &[]).unwrap_err();
    assert!(
        twice.contains("`limits`") && twice.contains("two rules"),
        "{twice}"
    );
    let toml = file("[[limits]]\nkeys = \"app:*\"\ndefualt = 5\n");
    let err = serve(&["--config", toml.path().to_str().unwrap()], &[]).unwrap_err();
    assert!(err.contains("defualt"), "{err}");
}
