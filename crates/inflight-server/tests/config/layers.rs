//! Where each setting comes from: flags > environment > file > defaults, and the Dify aliases.

use crate::{file, proxy, serve};

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
    use inflight_server::config::{FloorRule, Layered, LimitRule, Mode};
    use inflight_server::Settings;
    assert_eq!(
        LimitRule::parse("tenant:*=50,max=200"),
        Ok(LimitRule {
            keys: "tenant:*".into(),
            default: 50,
            max: 200,
            floors: Vec::new(),
            mode: Mode::Enforce,
        })
    );
    assert_eq!(
        LimitRule::parse("app:*=10,shadow"),
        Ok(LimitRule {
            keys: "app:*".into(),
            default: 10,
            max: 0,
            floors: Vec::new(),
            mode: Mode::Shadow,
        })
    );
    assert_eq!(
        LimitRule::parse("app:*=10,mode=shadow"),
        LimitRule::parse("app:*=10,shadow")
    );
    assert!(LimitRule::parse("app:*=shadow").is_err());
    assert!(LimitRule::parse("app:*=10,mode=loud").is_err());
    assert_eq!(
        LimitRule::parse("app:*=max=9"),
        Ok(LimitRule {
            keys: "app:*".into(),
            default: 0,
            max: 9,
            floors: Vec::new(),
            mode: Mode::Enforce,
        })
    );
    assert_eq!(
        LimitRule::parse("model:*=10,floor=9:4,floor=5:2"),
        Ok(LimitRule {
            keys: "model:*".into(),
            default: 10,
            max: 0,
            floors: vec![
                FloorRule {
                    priority: 9,
                    slots: 4
                },
                FloorRule {
                    priority: 5,
                    slots: 2
                }
            ],
            mode: Mode::Enforce,
        })
    );
    for bad in [
        "tenant:*",
        "a=x",
        "a=1,min=2",
        "a=1,2",
        "a=1,floor=9",
        "a=1,floor=256:1",
    ] {
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
    // Floors beside the limits, in the file or a flag; a bad one names the setting.
    let toml = file(
        "[[limits]]\nkeys = \"model:*\"\ndefault = 10\nfloors = [{ priority = 9, slots = 4 }]\n",
    );
    let floored = ["inflight", "--config", toml.path().to_str().unwrap()];
    let with_floors = Settings::from_flags(floored).unwrap().policy().unwrap();
    assert_eq!(with_floors.floors_of("model:a").of(9), 4);
    let flags = ["inflight", "--limit", "model:*=10,floor=9:4"];
    let with_floors = Settings::from_flags(flags).unwrap().policy().unwrap();
    assert_eq!(with_floors.floors_of("model:a").levels(), [(9, 4)]);
    let zero = ["inflight", "--limit", "model:*=10,floor=9:0"];
    let err = match Settings::from_flags(zero) {
        Ok(settings) => settings.policy().unwrap_err().to_string(),
        Err(err) => err.to_string(),
    };
    assert!(err.contains("limit"), "{err}");
    // A floor's level must be one of --priorities, when they are given.
    let outside = [
        "inflight",
        "--limit",
        "model:*=10,floor=9:4",
        "--priorities",
        "0,5",
    ];
    let err = Settings::from_flags(outside).unwrap_err().to_string();
    assert!(err.contains("priorities"), "{err}");
    let inside = [
        "inflight",
        "--limit",
        "model:*=10,floor=9:4",
        "--priorities",
        "0,9",
    ];
    assert_eq!(Settings::from_flags(inside).unwrap().priorities, [0, 9]);
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
    // A floor's level must be one of --priorities, when they are given.
    let outside = [
        "inflight",
        "--limit",
        "model:*=10,floor=9:4",
        "--priorities",
        "0,5",
    ];
    let err = Settings::from_flags(outside).unwrap_err().to_string();
    assert!(err.contains("priorities"), "{err}");
    let inside = [
        "inflight",
        "--limit",
        "model:*=10,floor=9:4",
        "--priorities",
        "0,9",
    ];
    assert_eq!(Settings::from_flags(inside).unwrap().priorities, [0, 9]);
    let twice = serve(&["--limit", "a=1", "--limit", "a=2"], &[]).unwrap_err();
    assert!(
        twice.contains("`limits`") && twice.contains("two rules"),
        "{twice}"
    );
    let toml = file("[[limits]]\nkeys = \"app:*\"\ndefualt = 5\n");
    let err = serve(&["--config", toml.path().to_str().unwrap()], &[]).unwrap_err();
    assert!(err.contains("defualt"), "{err}");
}
