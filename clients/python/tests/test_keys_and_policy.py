"""Key names, ids and classes of keys: the Rust unit tests (naming.rs, policy.rs), ported."""

from __future__ import annotations

import uuid

import pytest

from inflight_client import ClassLimits, Policy, Rule
from inflight_client._keys import member, names, tag


def leases(key: str) -> str:
    return names("inflight:", key)[0]


def test_every_key_gets_one_non_empty_hash_tag() -> None:
    assert leases("app-1") == "inflight:{app-1}:leases"
    assert leases("") == "inflight:{%}:leases"
    assert leases("a}b{c") == "inflight:{a%7Db%7Bc}:leases"
    assert leases("x}:limit") == "inflight:{x%7D:limit}:leases"
    assert leases("%") == "inflight:{%25}:leases"
    assert leases("a\nb\u0000") == "inflight:{a%0Ab%00}:leases"
    assert leases("ünï:code") == "inflight:{ünï:code}:leases"
    assert leases("a\u0085b") == "inflight:{a%C2%85b}:leases"  # a C1 control: its UTF-8 bytes


def test_distinct_keys_never_share_names() -> None:
    keys = ["", "%", "%25", "{", "%7B", "}", "a:b", "a", "b", "\u0000", "%00"]
    assert len({leases(k) for k in keys}) == len(keys)
    assert all(n.startswith("p:{k%7D}:") for n in names("p:", "k}"))
    assert tag("p:", "k") == "p:{k}"


def test_a_uuid_is_stored_as_17_bytes_and_a_given_id_as_its_text() -> None:
    u = uuid.uuid4()
    assert member(str(u)) == b"\xff" + u.bytes
    assert member(str(u).upper()) == str(u).upper().encode()
    assert member("req-42") == b"req-42"
    assert member("ünï") == "ünï".encode()


def test_reference_cases_resolve_as_the_reference_system() -> None:
    cases = [((0, 0, 0), None), ((0, 0, 5), 5), ((10, 0, 0), 10), ((20, 0, 5), 5), ((0, 15, 0), 15)]
    for (ceiling, default, over), want in cases:
        assert ClassLimits(default, ceiling).resolve(over) == want
    assert ClassLimits(3, 0).resolve(5) == 5
    assert ClassLimits(3, 4).resolve(5) == 4
    assert ClassLimits(3, 4).resolve(2) == 2


@pytest.mark.parametrize(
    "pattern,key,want",
    [
        ("tenant:*", "tenant:t1", True),
        ("tenant:*", "tenant:", True),
        ("tenant:*", "tenant", False),
        ("tenant:*", "xtenant:t1", False),
        ("global", "global", True),
        ("global", "global2", False),
        ("*", "", True),
        ("*:chat", "app:chat", True),
        ("*:chat", "app:chatter", False),
        ("a*b*c", "abc", True),
        ("a*b*c", "aXbYc", True),
        ("a*b*c", "acb", False),
        ("ab*ba", "aba", False),
        ("a**", "a", True),
        ("*é*", "clé:1", True),
    ],
)
def test_globs_match_runs_of_any_characters(pattern: str, key: str, want: bool) -> None:
    assert Rule(pattern).matches(key) is want


def test_the_most_specific_class_wins_and_caps_its_overrides() -> None:
    policy = Policy(
        0,
        0,
        [
            {"keys": "tenant:*", "default": 50, "max": 200},
            Rule("app:*", 5),
            {"keys": "global", "default": 1000},
            {"keys": "*", "max": 100},
            {"keys": "app:*:beta", "default": 1},
            {"keys": "app:vip*", "default": 9, "max": 10},
        ],
    )
    cases = [
        ("tenant:t1", None, 50),
        ("tenant:t1", 120, 120),
        ("tenant:t1", 500, 200),
        ("app:a1", None, 5),
        ("app:a1", 40, 40),
        ("app:a1:beta", None, 1),
        ("app:vip1", None, 9),
        ("app:vip1", 50, 10),
        ("app:vip1:beta", None, 9),
        ("global", None, 1000),
        ("global:eu", None, 100),
        ("user:7", None, 100),
        ("user:7", 300, 100),
    ]
    for key, over, want in cases:
        assert policy.resolve(key, over) == want, (key, over)
    open_policy = Policy(0, 0, [{"keys": "app:*", "default": 5}])
    assert open_policy.resolve("user:7") is None
    assert open_policy.resolve("user:7", 3) == 3


def test_bad_rules_are_refused() -> None:
    with pytest.raises(ValueError):
        Rule("")
    with pytest.raises(ValueError):
        Policy(0, 0, [{"keys": "a:*", "default": 1}, {"keys": "a:*", "default": 2}])
