"""What a setting's value may be, stated once for train.py's config check (:mod:`attnlab.runs.validate`) and the
typed part settings (:mod:`attnlab.modules.settings`), without torch.

A check is called with a value: None for a good one, else what is allowed (``"must be a positive integer"``), which
the caller puts after ``key=value:`` (:func:`show` writes the value as the user types it). The kinds are classes,
not closures, so that a test can generate the bad values of each kind a setting declares (tests/modules/
test_settings.py) and a new kind cannot arrive without them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Check = Callable[[Any], "str | None"]


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # true/false on the command line are not 1/0


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class Kind:
    """A check with a fixed message: ``allowed`` unless :meth:`accepts`."""

    allowed = ""

    def accepts(self, v: Any) -> bool:
        raise NotImplementedError

    def __call__(self, v: Any) -> str | None:
        return None if self.accepts(v) else self.allowed


class PositiveInt(Kind):
    allowed = "must be a positive integer"

    def accepts(self, v: Any) -> bool:
        return is_int(v) and v >= 1


class NonNegativeInt(Kind):
    allowed = "must be an integer >= 0"

    def accepts(self, v: Any) -> bool:
        return is_int(v) and v >= 0


class PositiveNumber(Kind):
    allowed = "must be a number > 0"

    def accepts(self, v: Any) -> bool:
        return is_number(v) and v > 0


class NonNegativeNumber(Kind):
    allowed = "must be a number >= 0"

    def accepts(self, v: Any) -> bool:
        return is_number(v) and v >= 0


class Probability(Kind):
    """A dropout rate: 1 would drop everything."""

    allowed = "must be a number in [0, 1)"

    def accepts(self, v: Any) -> bool:
        return is_number(v) and 0 <= v < 1


class UnitInterval(Kind):
    allowed = "must be a number in [0, 1]"

    def accepts(self, v: Any) -> bool:
        return is_number(v) and 0 <= v <= 1


class Boolean(Kind):
    allowed = "must be true or false"

    def accepts(self, v: Any) -> bool:
        return isinstance(v, bool)


@dataclass(frozen=True)
class OneOf(Kind):
    """A name from the code's own list (so a check cannot drift from what the code accepts)."""

    choices: tuple

    @property
    def allowed(self) -> str:  # type: ignore[override]
        return f"choose one of {', '.join(map(str, self.choices))}"

    def accepts(self, v: Any) -> bool:
        return not isinstance(v, bool) and v in self.choices  # (True == 1: a switch is not the first choice)


@dataclass(frozen=True)
class Optional:
    """``check``, or null (the code's default, e.g. ``attn.kv_heads=null``: n_heads)."""

    check: Check

    def __call__(self, v: Any) -> str | None:
        problem = self.check(v) if v is not None else None
        return problem and f"{problem} (or null)"


positive_int = PositiveInt()
non_negative_int = NonNegativeInt()
positive_number = PositiveNumber()
non_negative_number = NonNegativeNumber()
probability = Probability()
unit_interval = UnitInterval()
boolean = Boolean()


def one_of(choices) -> OneOf:
    return OneOf(tuple(choices))


def optional(check: Check) -> Optional:
    return Optional(check)


def show(v: Any) -> str:
    """A value as the user would type it on the command line."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(show(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{k}: {show(x)}" for k, x in v.items()) + "}"
    return str(v)


# a family's rules: a table of key patterns and checks, and relations between keys
def divisible(a: str, b: str, why: str) -> Callable[[Mapping[str, Any]], str | None]:
    def check(flat: Mapping[str, Any]) -> str | None:
        x, y = flat.get(a), flat.get(b)
        if is_int(x) and is_int(y) and y > 0 and x % y:
            return f"{a}={x} is not divisible by {b}={y} ({why})"
        return None

    return check


def same(a: str, b: str, why: str) -> Callable[[Mapping[str, Any]], str | None]:
    def check(flat: Mapping[str, Any]) -> str | None:
        if a in flat and b in flat and flat[a] != flat[b]:
            return f"{a}={show(flat[a])} but {b}={show(flat[b])}: {why}"
        return None

    return check


def key_pattern(glob: str) -> re.Pattern:
    return re.compile("[^.]*".join(re.escape(part) for part in glob.split("*")) + r"\Z")


def value_problems(flat: Mapping[str, Any], compiled: Sequence[tuple[re.Pattern, Check]]) -> list[str]:
    """``key=value: what is allowed`` for each value of ``flat`` whose first matching rule refuses it."""
    problems = []
    for key, value in flat.items():
        for pattern, check in compiled:
            if pattern.match(key):
                problem = check(value)
                if problem:
                    problems.append(f"{key}={show(value)}: {problem}")
                break
    return problems


def table_rules(rules: Sequence[tuple[str, Check]] = (),
                relations: Sequence[Callable[[Mapping[str, Any]], str | None]] = ()):
    """A family's config rules (:attr:`attnlab.families.Family.rules`) from a table like :data:`attnlab.runs.validate.RULES` (key
    pattern, check) and relations like :data:`attnlab.runs.validate.RELATIONS`; the relations run once the single values pass."""
    compiled = [(key_pattern(glob), check) for glob, check in rules]

    def family_rules(flat: Mapping[str, Any]) -> list[str]:
        return value_problems(flat, compiled) or [p for relation in relations if (p := relation(flat))]

    return family_rules
