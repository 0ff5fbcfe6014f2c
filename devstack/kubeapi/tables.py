"""Server-side Table output (`Accept: ...;as=Table;g=meta.k8s.io;v=v1`), which `kubectl get` prints."""

from __future__ import annotations

import datetime
import re
from typing import Any

from devstack.kubeapi.resources import Column, ResourceType

_NAME_COLUMN = {
    "name": "Name", "type": "string", "format": "name", "priority": 0,
    "description": "Name must be unique within a namespace.",
}
_STEP_RE = re.compile(r"\.([^.\[]+)|\[(\d+)\]|\['([^']*)'\]")


def wants_table(accept: str | None) -> bool:
    """Whether the client asked for Table output."""
    return "as=Table" in (accept or "")


def json_path(obj: Any, path: str) -> Any:
    """The value at a printer-column JSONPath of the simple kinds CRDs use (`.a.b`, `.a[0]`, `.a['x.y']`)."""
    path = path.strip().removeprefix("{").removesuffix("}").strip()
    for field, index, quoted in _STEP_RE.findall(path):
        if index:
            obj = obj[int(index)] if isinstance(obj, list) and int(index) < len(obj) else None
        else:
            obj = obj.get(field or quoted) if isinstance(obj, dict) else None
        if obj is None:
            return None
    return obj


def human_duration(seconds: float) -> str:
    """An age the way kubectl prints it (`45s`, `3m20s`, `5h`, `2d3h`)."""
    s = int(seconds)
    if s < 0:
        return "0s" if s > -2 else "<invalid>"
    if s < 120:
        return f"{s}s"
    minutes, hours = s // 60, s // 3600
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    years = days // 365
    if years < 8:
        return f"{years}y{days % 365}d" if days % 365 else f"{years}y"
    return f"{years}y"


def _cell(column: Column, obj: dict[str, Any]) -> Any:
    value = json_path(obj, column.json_path)
    if value is None:
        return column.missing
    if column.type == "date" and isinstance(value, str):
        try:
            then = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
        return human_duration((datetime.datetime.now(datetime.UTC) - then).total_seconds())
    if column.type == "string" and not isinstance(value, str):
        return str(value)
    return value


def _row(rt: ResourceType, obj: dict[str, Any], include: str) -> dict[str, Any]:
    row: dict[str, Any] = {"cells": [obj["metadata"]["name"], *(_cell(c, obj) for c in rt.columns)]}
    if include == "Object":
        row["object"] = obj
    elif include != "None":
        row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                         "metadata": obj["metadata"]}
    return row


def table(rt: ResourceType, objects: list[dict[str, Any]], resource_version: str | None,
          include: str | None = None) -> dict[str, Any]:
    """A meta.k8s.io/v1 Table of objects; `include` is the includeObject parameter (default: metadata)."""
    columns = [_NAME_COLUMN] + [
        {"name": c.name, "type": c.type, "format": c.format, "description": c.description, "priority": c.priority}
        for c in rt.columns
    ]
    metadata = {"resourceVersion": resource_version} if resource_version else {}
    return {
        "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata,
        "columnDefinitions": columns,
        "rows": [_row(rt, obj, include or "PartialObjectMetadata") for obj in objects],
    }
