"""Checks for the small, flat TOML tables users write by hand (rules, line formats) into frozen
dataclasses. pydantic did this before; importing it and building its models cost ~170 ms of every
`lossguard scan` start (a third of the process for a small file), for tables of a dozen scalars.
The messages keep pydantic's wording, which users and our tests already know.

A field declares its checks in its metadata with `spec(...)`; a class may add `_check(self)` for
rules that span fields (it returns an error text or None)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

_NUMBER = "Input should be a valid number"


def spec(
    kind: type | tuple[str, ...],
    *,
    optional: bool = False,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    min_length: int | None = None,
) -> dict[str, Any]:
    """`kind` is str, int, float, list (of non-empty strings, kept as a tuple) or a tuple of allowed
    strings."""
    return {"lossguard": {"kind": kind, "optional": optional, "ge": ge, "gt": gt, "le": le, "min_length": min_length}}


def _problem(value: Any, rule: dict[str, Any]) -> str | None:
    kind = rule["kind"]
    if value is None:
        return None if rule["optional"] else "Input should not be None"
    if isinstance(kind, tuple):
        if value not in kind:
            choices = ", ".join(repr(k) for k in kind[:-1]) + f" or {kind[-1]!r}" if len(kind) > 1 else repr(kind[0])
            return f"Input should be {choices}"
        return None
    if kind is list:
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
            return "Input should be a non-empty list of non-empty strings"
        return None
    if kind is str:
        if not isinstance(value, str):
            return "Input should be a valid string"
        if rule["min_length"] is not None and len(value) < rule["min_length"]:
            return f"String should have at least {rule['min_length']} character" + ("s" if rule["min_length"] != 1 else "")
        return None
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            return "Input should be a valid integer"
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return _NUMBER
        # TOML writes inf and nan, and integers of any size; no parameter means anything there (a
        # factor of inf never fires, a bound of nan compares false with everything).
        try:
            finite = math.isfinite(value)
        except OverflowError:
            finite = False
        if not finite:
            return "Input should be a finite number"
    if rule["ge"] is not None and not value >= rule["ge"]:
        return f"Input should be greater than or equal to {rule['ge']}"
    if rule["gt"] is not None and not value > rule["gt"]:
        return f"Input should be greater than {rule['gt']}"
    if rule["le"] is not None and not value <= rule["le"]:
        return f"Input should be less than or equal to {rule['le']}"
    return None


def _short(value: Any) -> str:
    """The value as the user wrote it, cut short (a 300-digit integer must not fill the error line)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def build(cls: type, raw: Any) -> Any:
    """An instance of the dataclass `cls` from a TOML table, or ValueError listing every problem
    ("field: reason (got value)"), in field order."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"expected a table, got {type(raw).__name__}")
    declared = {f.name: f for f in dataclasses.fields(cls) if f.init}
    problems = [f"unknown field `{key}`" for key in raw if key not in declared]
    values = {}
    for name, f in declared.items():
        rule = f.metadata.get("lossguard")
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                problems.append(f"{name}: Field required")
            continue
        value = raw[name]
        reason = _problem(value, rule) if rule else None
        if reason:
            shown = f" (got {_short(value)})" if not isinstance(value, (dict, list)) else ""
            problems.append(f"{name}: {reason}{shown}")
            continue
        kind = rule["kind"] if rule else None
        values[name] = float(value) if kind is float and value is not None else tuple(value) if kind is list else value
    if problems:
        raise ValueError("; ".join(problems))
    made = cls(**values)
    check = getattr(made, "_check", None)
    if check is not None and (reason := check()):
        raise ValueError(reason)
    return made
