"""Label and field selectors as the API server parses them from list and watch query strings."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from devstack.kubeapi.errors import bad_request

Predicate = Callable[[dict[str, Any]], bool]

_SET_RE = re.compile(r"^\s*([^\s!=(),]+)\s+(in|notin)\s*\(([^)]*)\)\s*$")
_EQ_RE = re.compile(r"^\s*([^\s!=(),]+)\s*(==|=|!=)\s*([^\s!=(),]*)\s*$")
_EXISTS_RE = re.compile(r"^\s*(!?)\s*([^\s!=(),]+)\s*$")


def _split_top_level(text: str) -> list[str]:
    # Commas inside `in (a,b)` belong to one requirement, so split only outside parentheses.
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def _label_requirement(text: str) -> Predicate:
    if match := _SET_RE.match(text):
        key, op, raw = match.groups()
        values = {v.strip() for v in raw.split(",") if v.strip()}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if match := _EQ_RE.match(text):
        key, op, value = match.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if match := _EXISTS_RE.match(text):
        negate, key = match.groups()
        return (lambda labels: key not in labels) if negate else (lambda labels: key in labels)
    raise bad_request(f"unable to parse requirement: {text!r}")


def label_selector(text: str | None) -> Predicate:
    """A predicate over whole objects for a labelSelector string (=, ==, !=, in, notin, exists, !exists)."""
    requirements = [_label_requirement(part) for part in _split_top_level(text or "")]

    def matches(obj: dict[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(req(labels) for req in requirements)
    return matches


def field_value(obj: dict[str, Any], dotted: str) -> str:
    """The string a field selector compares against; missing fields read as empty."""
    value: Any = obj
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def field_selector(text: str | None) -> Predicate:
    """A predicate for a fieldSelector string; any dotted path is accepted (the real server whitelists)."""
    terms = []
    for part in _split_top_level(text or ""):
        match = _EQ_RE.match(part)
        if not match:
            raise bad_request(f"invalid field selector: {part!r}")
        terms.append(match.groups())

    def matches(obj: dict[str, Any]) -> bool:
        return all((field_value(obj, key) == value) != (op == "!=") for key, op, value in terms)
    return matches


def selected_name(text: str | None) -> str | None:
    """The name pinned by `metadata.name=x` in a field selector, if any (lets a watch target one object)."""
    for part in _split_top_level(text or ""):
        match = _EQ_RE.match(part)
        if match and match.group(1) == "metadata.name" and match.group(2) != "!=":
            return match.group(3)
    return None
