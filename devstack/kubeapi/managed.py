"""metadata.managedFields as the API server records them: who set which field, last.

Each write names a field manager: its ``fieldManager`` parameter, else the first word of its
User-Agent (``kubectl/v1.35.4 (linux/amd64) ...`` -> ``kubectl``, what ``kubectl patch``
leaves when it sends no fieldManager). The fields a write changed move to that manager's
entry (one per manager, operation and subresource) and leave every other entry; an entry left
with no field is dropped. A create gives every field it sets to its manager. A write through
a custom resource's ``/scale`` gives ``spec.replicas`` to its manager on an entry with
subresource ``scale`` (``kubectl scale --replicas=1`` leaves ``kubectl``), except a write of 0:
the autoscaling/v1 Scale omits a zero replicas (omitempty), so the real server's Scale holds no
field for it and ``spec.replicas`` is left with no manager at all (kube-apiserver 1.35.4,
measured in tests/kube_real/test_real_writers.py).

Simplified against the real server: a list is one field (the real server tracks list items by
key), and an Apply takes its fields like an Update does (the real server shares a field among
appliers of the same value and refuses conflicting applies without force).
"""

from __future__ import annotations

from typing import Any

MAX_MANAGER = 128  # the real server cuts a User-Agent's name at this length

Path = tuple[str, ...]


def manager_of(field_manager: str | None, user_agent: str | None) -> str:
    """The request's field manager: its parameter, else its User-Agent's first word."""
    if field_manager:
        return field_manager[:MAX_MANAGER]
    name = (user_agent or "").split("/")[0]
    return "".join(ch for ch in name if ch.isprintable())[:MAX_MANAGER]


def _leaves(obj: Any, prefix: Path = ()) -> dict[Path, Any]:
    """Every leaf field of ``obj`` (a dict's scalars and lists) by its path."""
    if not isinstance(obj, dict) or (prefix and not obj):
        return {prefix: obj} if prefix else {}
    found: dict[Path, Any] = {}
    for key, value in obj.items():
        found.update(_leaves(value, (*prefix, str(key))))
    return found


def _tracked(obj: dict[str, Any], subresource: str | None) -> dict[Path, Any]:
    """The fields a write of ``subresource`` can own: the status, or everything else but
    the identity and the server's own metadata."""
    leaves = _leaves(obj)
    if subresource == "status":
        return {p: v for p, v in leaves.items() if p[0] == "status"}
    return {p: v for p, v in leaves.items() if p[0] not in ("status", "apiVersion", "kind")
            and (p[0] != "metadata" or (len(p) > 1 and p[1] in ("labels", "annotations",
                                                                 "finalizers")))}


def _fields_v1(paths: set[Path]) -> dict[str, Any]:
    """A FieldsV1 set ({"f:spec": {"f:replicas": {}}}) of ``paths``."""
    root: dict[str, Any] = {}
    for path in sorted(paths):
        node = root
        for part in path:
            node = node.setdefault(f"f:{part}", {})
    return root


def _paths(fields: Any, prefix: Path = ()) -> set[Path]:
    """The leaf paths of a FieldsV1 set."""
    if not isinstance(fields, dict) or not fields:
        return {prefix} if prefix else set()
    found: set[Path] = set()
    for key, value in fields.items():
        if key.startswith("f:"):
            found |= _paths(value, (*prefix, key[2:]))
    return found


def _under(path: Path, changed: set[Path]) -> bool:
    """Whether ``path`` is one of ``changed``, inside one, or holds one."""
    return any(path[:len(c)] == c or c[:len(path)] == path for c in changed)


def record(current: dict[str, Any] | None, new: dict[str, Any], manager: str, operation: str,
           subresource: str | None, stamp: str) -> list[dict[str, Any]]:
    """``new``'s managedFields after ``manager``'s write that turned ``current`` into it."""
    before = _tracked(current, subresource) if current is not None else {}
    after = _tracked(new, subresource)
    changed = {p for p, v in after.items() if before.get(p, object()) != v}
    gone = {p for p in before if p not in after}
    entries = [] if current is None else \
        [dict(e) for e in (current.get("metadata") or {}).get("managedFields") or []]
    key = (manager, operation, subresource or "")
    kept: list[dict[str, Any]] = []
    mine: set[Path] = set()
    for entry in entries:
        owned = _paths(entry.get("fieldsV1"))
        if (entry.get("manager"), entry.get("operation"), entry.get("subresource", "")) == key:
            mine = {p for p in owned if not _under(p, gone)}
            continue
        owned = {p for p in owned if not _under(p, changed | gone)}
        if owned:
            kept.append({**entry, "fieldsV1": _fields_v1(owned)})
    mine |= changed
    if subresource == "scale":
        mine = {p for p in mine if after.get(p) != 0}  # a Scale omits replicas 0 (docstring)
    if mine:
        entry = {"manager": manager, "operation": operation, "apiVersion": new.get("apiVersion"),
                 "time": stamp, "fieldsType": "FieldsV1", "fieldsV1": _fields_v1(mine)}
        if subresource:
            entry["subresource"] = subresource
        kept.append(entry)
    return kept
