//! Bad values, and settings that are gone, refused by name with a non-zero exit.

use crate::{file, proxy, serve, start};

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
            vec!["--layout", "dify", "--store", "redis://127.0.0.1:9"],
            vec![],
            "default_limit",
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
            vec!["--holder", "{header:Cookie}"],
            vec![],
            "`holder`",
            "secret",
        ),
        (
            vec![],
            vec![("INFLIGHT_HOLDER", "{client}")],
            "`holder`",
            "unknown placeholder",
        ),
        (vec!["--holder", ""], vec![], "`holder`", "empty"),
        (
            vec!["--on-revoke", "shrug"],
            vec![],
            "`on_revoke`",
            "end or finish",
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
