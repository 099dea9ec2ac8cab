//! The limit rule and the policy's classes, through the public API: the reference system's cases, the
//! most specific rule, bad rules, a shared policy's reloads.
#![allow(missing_docs)]

use inflight::{ClassLimits, Limit, Policy, Rule, SharedPolicy};

#[test]
fn reference_cases_resolve_as_the_reference_system() {
    // (ceiling, default, override) -> effective
    let cases = [
        ((0, 0, 0), Limit::Unlimited),
        ((0, 0, 5), Limit::Limited(5)),
        ((10, 0, 0), Limit::Limited(10)),
        ((20, 0, 5), Limit::Limited(5)),
        ((0, 15, 0), Limit::Limited(15)),
    ];
    for ((ceiling, default, over), want) in cases {
        let limits = ClassLimits::new(default, ceiling);
        assert_eq!(
            limits.resolve(Some(over)),
            want,
            "{ceiling} {default} {over}"
        );
        assert_eq!(limits.resolve((over > 0).then_some(over)), want);
    }
}

#[test]
fn override_may_exceed_default_but_not_ceiling() {
    assert_eq!(ClassLimits::new(3, 0).resolve(Some(5)), Limit::Limited(5));
    assert_eq!(ClassLimits::new(3, 4).resolve(Some(5)), Limit::Limited(4));
    assert_eq!(ClassLimits::new(3, 4).resolve(Some(2)), Limit::Limited(2));
}

#[test]
fn globs_match_runs_of_any_characters() {
    let cases = [
        ("tenant:*", "tenant:t1", true),
        ("tenant:*", "tenant:", true),
        ("tenant:*", "tenant", false),
        ("tenant:*", "xtenant:t1", false),
        ("global", "global", true),
        ("global", "global2", false),
        ("*", "", true),
        ("*:chat", "app:chat", true),
        ("*:chat", "app:chatter", false),
        ("a*b*c", "abc", true),
        ("a*b*c", "aXbYc", true),
        ("a*b*c", "acb", false),
        ("ab*ba", "aba", false),
        ("a**", "a", true),
        ("*é*", "clé:1", true),
    ];
    for (pattern, key, want) in cases {
        let rule = Rule::new(pattern, ClassLimits::default()).unwrap();
        assert_eq!(rule.matches(key), want, "{pattern:?} on {key:?}");
    }
}

/// key, override -> effective, under the rules of the example and a few more.
#[test]
fn the_most_specific_class_wins_and_caps_its_overrides() {
    let policy = Policy::new(0, 0)
        .rule("tenant:*", ClassLimits::new(50, 200))
        .and_then(|p| p.rule("app:*", ClassLimits::new(5, 0)))
        .and_then(|p| p.rule("global", ClassLimits::new(1000, 0)))
        .and_then(|p| p.rule("*", ClassLimits::new(0, 100)))
        .and_then(|p| p.rule("app:*:beta", ClassLimits::new(1, 0)))
        .and_then(|p| p.rule("app:vip*", ClassLimits::new(9, 10)))
        .unwrap();
    let cases = [
        ("tenant:t1", None, Limit::Limited(50)),
        ("tenant:t1", Some(120), Limit::Limited(120)),
        ("tenant:t1", Some(500), Limit::Limited(200)),
        ("app:a1", None, Limit::Limited(5)),
        ("app:a1", Some(40), Limit::Limited(40)),
        ("app:a1:beta", None, Limit::Limited(1)),
        ("app:vip1", None, Limit::Limited(9)),
        ("app:vip1", Some(50), Limit::Limited(10)),
        ("app:vip1:beta", None, Limit::Limited(9)),
        ("global", None, Limit::Limited(1000)),
        ("global:eu", None, Limit::Limited(100)),
        ("user:7", None, Limit::Limited(100)),
        ("user:7", Some(300), Limit::Limited(100)),
    ];
    for (key, over, want) in cases {
        assert_eq!(policy.resolve(key, over), want, "{key} with {over:?}");
    }
    let open = Policy::new(0, 0)
        .rule("app:*", ClassLimits::new(5, 0))
        .unwrap();
    assert_eq!(open.resolve("user:7", None), Limit::Unlimited);
    assert_eq!(open.resolve("user:7", Some(3)), Limit::Limited(3));
    assert!(!open.is_unlimited_by_default());
    assert!(Policy::new(0, 0).is_unlimited_by_default());
}

#[test]
fn bad_rules_are_refused() {
    assert!(Policy::new(0, 0).rule("", ClassLimits::default()).is_err());
    let twice = Policy::new(0, 0)
        .rule("a:*", ClassLimits::new(1, 0))
        .unwrap();
    assert!(twice.rule("a:*", ClassLimits::new(2, 0)).is_err());
}

#[test]
fn a_shared_policy_changes_for_every_clone() {
    let shared = SharedPolicy::new(Policy::new(1, 0));
    let other = shared.clone();
    shared.set(Policy::new(7, 0));
    assert_eq!(other.get().resolve("k", None), Limit::Limited(7));
}
