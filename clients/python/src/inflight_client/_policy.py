"""Classes of keys and their limits: the same rules as inflight's ``Policy`` (``policy.rs``).

A rule's pattern is a glob where ``*`` matches any run of characters. The most specific matching rule wins:
the longest literal prefix, then the most literal text, then an exact pattern over a starred one, then
the rule given first. Keys that match no rule have the default limits, and are of the class ``default``. An
override of a key is capped by its class's max.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import _input

MAX_RULES = 1024
DEFAULT_CLASS = "default"  # the class of keys that match no rule, as refusals and metrics name it


@dataclass(frozen=True)
class ClassLimits:
    """The limits of a class of keys: ``default`` (a key without an override; 0: unlimited) and ``max``
    (the ceiling over the default and every override; 0: none)."""

    default: int = 0
    max: int = 0

    def __post_init__(self) -> None:
        _input.limit(self.default, "a default limit")
        _input.limit(self.max, "a max limit")

    def resolve(self, override: int | None = None) -> int | None:
        """The effective limit (``None``: unlimited), as ``ClassLimits::resolve`` and ``base.lua``."""
        own = override if override is not None and override > 0 else self.default
        limit = self.max if own == 0 or (self.max > 0 and own > self.max) else own
        return limit or None

    @property
    def unlimited(self) -> bool:
        return self.default == 0 and self.max == 0


@dataclass(frozen=True)
class Rule:
    """The limits of the keys matching ``keys`` (a glob with ``*``)."""

    keys: str
    default: int = 0
    max: int = 0
    _parts: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.keys, str):
            raise TypeError(f"a rule's pattern must be a str, not {type(self.keys).__name__}")
        if not self.keys or len(self.keys.encode()) > _input.MAX_NAME_BYTES:
            raise ValueError(f"a rule's pattern must be 1 to 256 bytes, not {self.keys!r}")
        _input.limit(self.default, "a default limit")
        _input.limit(self.max, "a max limit")
        object.__setattr__(self, "_parts", tuple(self.keys.split("*")))

    @property
    def limits(self) -> ClassLimits:
        return ClassLimits(self.default, self.max)

    @property
    def starred(self) -> bool:
        return len(self._parts) > 1

    def matches(self, key: str) -> bool:
        first, *rest = self._parts
        if not rest:
            return key == first
        if not key.startswith(first):
            return False
        left = key[len(first) :]
        *middle, last = rest
        for part in middle:
            at = left.find(part)
            if at < 0:
                return False
            left = left[at + len(part) :]
        return len(left) >= len(last) and left.endswith(last)

    def specificity(self) -> tuple[int, int, bool]:
        literal = sum(len(part.encode()) for part in self._parts)
        return len(self._parts[0].encode()), literal, not self.starred


RuleLike = Rule | Mapping[str, Any]


def _rule(rule: RuleLike) -> Rule:
    if isinstance(rule, Rule):
        return rule
    return Rule(str(rule["keys"]), int(rule.get("default", 0)), int(rule.get("max", 0)))


class Policy:
    """The default limits and the rules of classes of keys."""

    def __init__(self, default_limit: int = 0, max_limit: int = 0, rules: Iterable[RuleLike] = ()) -> None:
        self.default = ClassLimits(default_limit, max_limit)
        given = [_rule(rule) for rule in rules]
        if len(given) > MAX_RULES:
            raise ValueError(f"at most {MAX_RULES} rules")
        seen: set[str] = set()
        for rule in given:
            if rule.keys in seen:
                raise ValueError(f"two rules for the keys {rule.keys!r}")
            seen.add(rule.keys)
        # Stable: among equally specific rules the first given stays first.
        self.rules: list[Rule] = sorted(given, key=Rule.specificity, reverse=True)

    def rule_for(self, key: str) -> Rule | None:
        """The rule of the key's class; ``None`` when no rule matches it (it has the defaults)."""
        for rule in self.rules:
            if rule.matches(key):
                return rule
        return None

    def limits(self, key: str) -> ClassLimits:
        """The limits of the key's class."""
        rule = self.rule_for(key)
        return self.default if rule is None else rule.limits

    def class_of(self, key: str) -> str:
        """The name of the key's class, as refusals and metrics name it (``Policy::class_of``): the pattern
        of its rule (``"app:*"``), or ``"default"`` when no rule matches it.

        >>> policy = Policy(10, 0, [Rule("app:*", 5)])
        >>> policy.class_of("app:a1"), policy.class_of("tenant:t1")
        ('app:*', 'default')
        """
        rule = self.rule_for(key)
        return DEFAULT_CLASS if rule is None else rule.keys

    def resolve(self, key: str, override: int | None = None) -> int | None:
        """The key's effective limit given its override (``None``: unlimited)."""
        return self.limits(key).resolve(override)
