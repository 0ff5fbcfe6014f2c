"""Resource URLs and verbs: what a request addresses, in Kubernetes RBAC terms.

kmock parses paths too, but reads `/api/v1/namespaces/x` as "namespace x, no resource", fails
on `/api/v1/namespaces`, and detects watches only for `watch=true` (the Python client sends
`watch=True`); hence this parser.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import NamedTuple

_NAMESPACE_SUBRESOURCES = ("status", "finalize")
_TRUE = ("1", "true", "True")


@dataclasses.dataclass(frozen=True)
class Target:
    """What a resource URL addresses."""

    group: str
    version: str
    plural: str
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None
    legacy_watch: bool = False  # the deprecated /watch/ path prefix


class RequestRecord(NamedTuple):
    """One resource request as RBAC sees it: verb is get/list/watch/create/update/patch/delete/deletecollection."""

    verb: str
    group: str
    resource: str
    subresource: str | None
    namespace: str | None
    name: str | None


def parse(path: str) -> Target | None:
    """The resource a URL addresses, or None for discovery documents and non-API paths."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    legacy_watch = rest[0] == "watch"
    rest = rest[1:] if legacy_watch else rest
    namespace = None
    is_namespace_subresource = len(rest) == 3 and rest[0] == "namespaces" and rest[2] in _NAMESPACE_SUBRESOURCES
    if len(rest) >= 3 and rest[0] == "namespaces" and not (group == "" and is_namespace_subresource):
        namespace, rest = rest[1], rest[2:]
    if not 1 <= len(rest) <= 3:
        return None
    plural, name, subresource = (rest + [None, None])[:3]
    return Target(group, version, plural, namespace, name, subresource, legacy_watch)


def verb(method: str, target: Target, params: Mapping[str, str]) -> str:
    """The RBAC verb of a request; unknown methods map to their lower-cased name."""
    if method == "GET":
        if target.legacy_watch or params.get("watch") in _TRUE:
            return "watch"
        return "get" if target.name else "list"
    if method == "DELETE":
        return "delete" if target.name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def caller(authorization: str | None) -> str:
    """Who sent a request: the bearer token without its `-token` suffix ("" when anonymous)."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        return ""
    return token.strip().removesuffix("-token")


def record_of(verb_name: str, target: Target) -> RequestRecord:
    """The record entry for a request."""
    return RequestRecord(verb_name, target.group, target.plural, target.subresource, target.namespace, target.name)
