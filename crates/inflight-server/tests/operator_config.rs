//! What an operator reads and checks: `inflight.example.toml` has every setting with its default, and
//! `inflight check-config` agrees with it; errors name the setting, or the variable a bad value came
//! from; `--help` is grouped by topic. Runs the real binary where the command line is what is tested.
#![allow(missing_docs)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use clap::Args;
use inflight_server::config::{Layered, ProxySettings};

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../inflight.example.toml")
}

/// Runs `inflight ARGS` with only `env` set (plus PATH).
fn inflight(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_inflight"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .output()
        .expect("run inflight")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Every setting of `serve` and `proxy` (the ids of their flags, which are the TOML keys).
fn settings() -> BTreeSet<String> {
    let command = ProxySettings::augment_args(clap::Command::new("inflight"));
    command
        .get_arguments()
        .map(|arg| arg.get_id().to_string())
        .filter(|id| id != "config")
        .collect()
}

#[test]
fn the_example_names_every_setting() {
    let example = std::fs::read_to_string(example()).unwrap();
    let named: BTreeSet<String> = example
        .lines()
        .filter_map(|line| {
            let line = line.trim_start_matches('#').trim_start();
            if line.starts_with("[[limits]]") {
                return Some("limits".to_owned());
            }
            let (key, _) = line.split_once(" = ")?;
            key.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                .then(|| key.to_owned())
        })
        .collect();
    let settings = settings();
    let missing: Vec<&String> = settings.iter().filter(|s| !named.contains(*s)).collect();
    assert!(
        missing.is_empty(),
        "not in inflight.example.toml: {missing:?}"
    );
    let unknown: Vec<&String> = named
        .iter()
        .filter(|s| !settings.contains(*s) && !["keys", "default", "max"].contains(&s.as_str()))
        .collect();
    assert!(unknown.is_empty(), "no such setting: {unknown:?}");
}

#[test]
fn the_examples_values_are_the_defaults() {
    let upstream = ["--upstream", "http://127.0.0.1:5001"];
    let defaults = ProxySettings::from_flags([&["inflight"][..], &upstream].concat()).unwrap();
    let example = example();
    let from_file = ProxySettings::from_flags(
        [
            &["inflight", "--config", example.to_str().unwrap()][..],
            &upstream,
        ]
        .concat(),
    )
    .unwrap();
    let json = |settings: &ProxySettings| {
        let mut value = serde_json::to_value(settings).unwrap();
        value.as_object_mut().unwrap().remove("config");
        value
    };
    assert_eq!(json(&from_file), json(&defaults));
}

#[test]
fn check_config_passes_the_example_and_names_what_is_wrong() {
    let example = example();
    let ok = inflight(&["check-config", example.to_str().unwrap()], &[]);
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    assert!(text(&ok.stdout).contains(": ok (the settings of `inflight serve`)"));

    let dir = std::env::temp_dir().join(format!("inflight-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        ("lease = \"5x\"\n", "invalid setting `lease`"),
        (
            "defualt_limit = 3\n",
            "invalid setting `defualt_limit`: no such setting",
        ),
        (
            "default_limit = \"many\"\n",
            "invalid setting `default_limit`",
        ),
        (
            "[[limits]]\nkeys = \"\"\ndefault = 1\n",
            "invalid setting `limits`",
        ),
        ("upstream = \"ftp://x\"\n", "invalid setting `upstream`"),
        ("max_connections = 0\n", "invalid setting `max_connections`"),
        ("store = \"mysql://x\"\n", "invalid setting `store`"),
    ];
    for (body, said) in cases {
        let file = dir.join("bad.toml");
        std::fs::write(&file, body).unwrap();
        let out = inflight(&["check-config", file.to_str().unwrap()], &[]);
        assert_eq!(out.status.code(), Some(1), "{body:?} passed");
        assert!(
            text(&out.stderr).contains(said),
            "{body:?}: {}",
            text(&out.stderr)
        );
    }
    // With `upstream` the file is checked as the proxy's; --proxy asks for that without it.
    let file = dir.join("proxy.toml");
    std::fs::write(&file, "upstream = \"http://127.0.0.1:5001\"\n").unwrap();
    let out = inflight(&["check-config", file.to_str().unwrap()], &[]);
    assert!(
        text(&out.stdout).contains("`inflight proxy`"),
        "{}",
        text(&out.stderr)
    );
    std::fs::write(&file, "default_limit = 2\n").unwrap();
    let out = inflight(&["check-config", "--proxy", file.to_str().unwrap()], &[]);
    assert!(text(&out.stderr).contains("invalid setting `upstream`"));
    let out = inflight(&["check-config", "/nonexistent/inflight.toml"], &[]);
    assert!(text(&out.stderr).contains("does not exist"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_bad_value_from_the_environment_names_its_variable() {
    let out = inflight(&["serve"], &[("INFLIGHT_DEFAULT_LIMIT", "abc")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("in the environment variable INFLIGHT_DEFAULT_LIMIT"),
        "{}",
        text(&out.stderr)
    );
    let out = inflight(
        &["serve", "--limit", "bad"],
        &[("INFLIGHT_LIMITS", "tenant:*=1")],
    );
    assert!(
        !text(&out.stderr).contains("environment variable"),
        "the bad value came from the flag: {}",
        text(&out.stderr)
    );
    let example = example();
    let out = inflight(
        &["check-config", example.to_str().unwrap()],
        &[("INFLIGHT_LEASE", "forever")],
    );
    assert!(
        text(&out.stderr).contains("in the environment variable INFLIGHT_LEASE"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn help_is_grouped_by_topic_with_defaults_and_variables() {
    for (command, headings) in [
        (
            "serve",
            &[
                "Listening:",
                "TLS:",
                "Connections:",
                "Store:",
                "Limits:",
                "Quotas:",
                "Admin:",
                "Logging and metrics:",
            ][..],
        ),
        ("proxy", &["Proxy:", "Admin:", "Limits:", "Store:"][..]),
    ] {
        let out = inflight(&[command, "--help"], &[]);
        assert!(out.status.success());
        let help = text(&out.stdout);
        for heading in headings {
            assert!(
                help.lines().any(|l| l == *heading),
                "{command} --help has no {heading}"
            );
        }
        // Every setting but --help is under a topic, and shows its variable.
        let options = help.split("\nOptions:\n").nth(1).unwrap();
        let ungrouped = options.split("\n\n").next().unwrap();
        assert!(
            !ungrouped.contains("--listen") && !ungrouped.contains("--store"),
            "{ungrouped}"
        );
        assert!(help.contains("[default: 30s]") && help.contains("[env: INFLIGHT_LEASE"));
    }
}

/// The lines `inflight ARGS` logs up to its start line.
fn start_lines(args: &[&str]) -> String {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_inflight"))
        .args(args)
        .env_clear()
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = String::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("inflight started") {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    seen
}

#[test]
fn serve_without_a_limit_says_every_key_is_unlimited() {
    let plain = start_lines(&["serve", "--listen", "127.0.0.1:0"]);
    assert!(plain.contains("every key is unlimited"), "{plain}");
    let limited = start_lines(&["serve", "--listen", "127.0.0.1:0", "--default-limit", "3"]);
    assert!(limited.contains("inflight started"), "{limited}");
    assert!(!limited.contains("every key is unlimited"), "{limited}");
    let classes = start_lines(&["serve", "--listen", "127.0.0.1:0", "--limit", "tenant:*=5"]);
    assert!(!classes.contains("every key is unlimited"), "{classes}");
}

/// contrib/systemd/inflight.service passes `systemd-analyze verify` (with its ExecStart pointed at the
/// binary under test), warnings included; skipped where systemd-analyze is missing.
#[test]
fn the_systemd_unit_verifies() {
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/systemd/inflight.service");
    let unit = std::fs::read_to_string(unit).unwrap();
    assert!(unit
        .contains("ExecStart=/usr/local/bin/inflight serve --config /etc/inflight/inflight.toml"));
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("systemd-analyze not found: the unit is not verified here");
        return;
    }
    let dir = std::env::temp_dir().join(format!("inflight-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("inflight.service");
    std::fs::write(
        &path,
        unit.replace("/usr/local/bin/inflight", env!("CARGO_BIN_EXE_inflight")),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let said = text(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(!said.contains("inflight.service"), "warnings: {said}");
}
