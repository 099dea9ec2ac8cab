//! The settings: TOML files of known and unknown keys with values of every type, and flags with any value.
//! A file or flags are accepted or refused naming a setting, never a panic; settings that pass their
//! checks make a server (its limits, its upstream) without a further error.

use std::path::Path;
use std::sync::LazyLock;

use clap::Args;
use inflight_server::config::Layered;
use inflight_server::{ProxySettings, Settings};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

/// Every setting's name (as in the file) and flag.
static SETTINGS: LazyLock<Vec<(String, String)>> = LazyLock::new(|| {
    ProxySettings::augment_args(clap::Command::new("inflight"))
        .get_arguments()
        .filter_map(|arg| Some((arg.get_id().to_string(), arg.get_long()?.to_owned())))
        .collect()
});

/// `serve`'s flags.
static SERVE_FLAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    Settings::augment_args(clap::Command::new("inflight"))
        .get_arguments()
        .filter_map(|arg| Some(arg.get_long()?.to_owned()))
        .collect()
});

/// Values that settings take, nearly take, or choke on.
const TEXTS: &[&str] = &[
    "10s",
    "0s",
    "1ms",
    "9ms",
    "10ms",
    "24h",
    "25h",
    "-1s",
    "1 day",
    "",
    " ",
    "memory://",
    "redis://127.0.0.1:1",
    "rediss://x",
    "unix:///tmp/x",
    "redis+unix:///x",
    "http://127.0.0.1:1",
    "http://x/base/",
    "https://x",
    "http://",
    "fail_open",
    "fail_open_local",
    "fail_closed",
    "reject",
    "pass",
    "127.0.0.1:0",
    "[::1]:0",
    "256.0.0.1:1",
    "{header:X}",
    "{bearer_hash}",
    "{path}",
    "tenant:*=5,max=2",
    "*=0",
    "=5",
    "a=b",
    "*",
    "0",
    "-1",
    "4294967296",
    "18446744073709551616",
    "true",
    "nope",
];

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(TEXTS).prop_map(String::from),
        1 => "[ -~]{0,20}",
        1 => (250usize..300).prop_map(|n| "k".repeat(n)),
    ]
}

/// A TOML value of any type, as text.
fn value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        3 => text().prop_map(|text| serde_json::to_string(&text).expect("a string")),
        2 => any::<i64>().prop_map(|n| n.to_string()),
        1 => prop::sample::select(&["0", "1", "64", "65", "1024", "100000", "1000000", "2147483647", "2147483648"][..])
            .prop_map(String::from),
        1 => prop::sample::select(&["1.5", "nan", "inf", "-0.0", "true", "false", "1979-05-27"][..])
            .prop_map(String::from),
    ];
    leaf.prop_recursive(1, 8, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4)
                .prop_map(|items| format!("[{}]", items.join(", "))),
            prop::collection::vec(("[a-z]{1,6}", inner), 0..3).prop_map(|fields| {
                let fields: Vec<String> =
                    fields.iter().map(|(k, v)| format!("{k} = {v}")).collect();
                format!("{{ {} }}", fields.join(", "))
            }),
        ]
    })
}

/// A setting's name in the file: a real one mostly.
fn name() -> impl Strategy<Value = String> {
    let names: Vec<String> = SETTINGS.iter().map(|(name, _)| name.clone()).collect();
    prop_oneof![
        6 => prop::sample::select(names),
        1 => prop::sample::select(&["config", "listen_", "LIMITS", "\"quoted key\""][..]).prop_map(String::from),
        1 => "[a-z_]{1,10}",
    ]
}

/// A `[[limits]]` table, with its fields or others.
fn limits_table() -> impl Strategy<Value = String> {
    let field = prop_oneof![
        3 => prop::sample::select(&["keys", "default", "max"][..]).prop_map(String::from),
        1 => "[a-z]{1,6}",
    ];
    prop::collection::vec((field, value()), 0..4).prop_map(|fields| {
        let lines: String = fields.iter().map(|(k, v)| format!("{k} = {v}\n")).collect();
        format!("[[limits]]\n{lines}")
    })
}

/// Settings files: top-level settings, then `[[limits]]` tables, sometimes with a garbage line.
pub(crate) fn files() -> impl Strategy<Value = String> {
    let settings = prop::collection::vec((name(), value()), 0..6);
    let tables = prop::collection::vec(limits_table(), 0..3);
    let garbage = prop::option::weighted(0.1, "[ -~\n]{0,40}");
    (settings, tables, garbage).prop_map(|(settings, tables, garbage)| {
        let mut text: String = settings
            .iter()
            .map(|(k, v)| format!("{k} = {v}\n"))
            .collect();
        text.push_str(&tables.concat());
        text.push_str(&garbage.unwrap_or_default());
        text
    })
}

/// A settings file is accepted (and then makes a server's parts) or refused naming a setting.
pub(crate) fn check_file(dir: &Path, text: &str) -> Result<(), TestCaseError> {
    let path = dir.join("settings.toml");
    std::fs::write(&path, text).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let path = path.to_str().expect("a UTF-8 temporary path");
    let proxy = ProxySettings::from_flags([
        "inflight",
        "--upstream",
        "http://127.0.0.1:9",
        "--config",
        path,
    ]);
    check_settings(proxy)?;
    let serve = Settings::from_flags(["inflight", "--config", path]);
    if let Err(error) = serve {
        prop_assert!(!error.setting.is_empty());
    }
    Ok(())
}

/// Accepted settings make a server's parts; refused ones name their setting.
fn check_settings(
    settings: Result<ProxySettings, inflight_server::ConfigError>,
) -> Result<(), TestCaseError> {
    match settings {
        Err(error) => prop_assert!(!error.setting.is_empty(), "a refusal that names nothing"),
        Ok(settings) => {
            let made = inflight_server::upstream(&settings)
                .and_then(|_| inflight_server::Shared::new(&settings.serve))
                .and_then(|_| settings.serve.failure_policy());
            prop_assert!(
                made.is_ok(),
                "checked settings that do not make a server: {:?}",
                made.err()
            );
        }
    }
    Ok(())
}

/// Flags: each a setting's flag with any value.
pub(crate) fn flags() -> impl Strategy<Value = Vec<(String, String)>> {
    let flags: Vec<String> = SETTINGS.iter().map(|(_, flag)| flag.clone()).collect();
    prop::collection::vec((prop::sample::select(flags), text()), 0..4)
}

/// Flags are accepted or refused naming a setting, never a panic.
pub(crate) fn check_flags(flags: Vec<(String, String)>) -> Result<(), TestCaseError> {
    let mut args = vec!["inflight".to_owned()];
    for (flag, value) in &flags {
        // A file would be read, and no file is meant; the rest take their value as given.
        if flag == "config" {
            continue;
        }
        args.push(format!("--{flag}={value}"));
    }
    let with_upstream = args
        .iter()
        .any(|arg| arg.starts_with("--upstream="))
        .then(Vec::new)
        .unwrap_or_else(|| vec!["--upstream=http://127.0.0.1:9".to_owned()]);
    check_settings(ProxySettings::from_flags(args.iter().chain(&with_upstream)))?;
    // `serve` has some of the proxy's flags only.
    let serve_args = args.iter().filter(|arg| {
        SERVE_FLAGS
            .iter()
            .any(|flag| arg.starts_with(&format!("--{flag}=")))
            || *arg == "inflight"
    });
    if let Err(error) = Settings::from_flags(serve_args) {
        prop_assert!(!error.setting.is_empty());
    }
    Ok(())
}
