"""RBAC coverage: do these PolicyRules allow exactly the API calls a process made?

A *record* is one API request, as a dict or a tuple ``(verb, group, resource, subresource,
namespace, name)``; ``group`` is "" for the core API, ``subresource``/``namespace``/``name`` may
be "" or None. The e2e suite feeds the emulator's request log through these helpers.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, NamedTuple, Sequence


class Request(NamedTuple):
    verb: str
    group: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    def target(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else " (cluster)"
        return f"{self.verb} {self.group or 'core'}/{self.target()}{where}"


FIELDS = Request._fields


def as_request(record: Request | Mapping[str, Any] | Sequence[Any]) -> Request:
    """Normalise a dict or tuple record into a Request."""
    if isinstance(record, Request):
        return record
    if isinstance(record, Mapping):
        values = {k: record.get(k) for k in FIELDS}
        values["group"] = values.get("group") or record.get("apiGroup") or ""
    else:
        values = dict(zip(FIELDS, record))
    return Request(**{k: (values.get(k) or "") for k in FIELDS})


def _rule_allows(rule: Mapping[str, Any], req: Request) -> bool:
    def hit(items: Iterable[str] | None, value: str) -> bool:
        items = list(items or [])
        return "*" in items or value in items

    if not hit(rule.get("verbs"), req.verb) or not hit(rule.get("apiGroups"), req.group):
        return False
    resources = list(rule.get("resources") or [])
    target = req.target()
    if not ("*" in resources or target in resources
            or (req.subresource and f"*/{req.subresource}" in resources)):
        return False
    names = rule.get("resourceNames")
    # resourceNames cannot authorise list/watch/create of unnamed objects
    return not names or (bool(req.name) and req.name in names)


def _rules_by_scope(rules: Any) -> list[tuple[str | None, Mapping[str, Any]]]:
    """Accept plain rules, or Role/ClusterRole objects (Role rules are scoped to its namespace)."""
    if isinstance(rules, Mapping):
        rules = [rules]
    scoped: list[tuple[str | None, Mapping[str, Any]]] = []
    for item in rules:
        if item.get("kind") in ("Role", "ClusterRole"):
            ns = item["metadata"].get("namespace") if item["kind"] == "Role" else None
            scoped.extend((ns, rule) for rule in item.get("rules") or [])
        else:
            scoped.append((None, item))
    return scoped


def _allows(scoped: list[tuple[str | None, Mapping[str, Any]]], req: Request) -> bool:
    for namespace, rule in scoped:
        # a Role grants only inside its namespace, never cluster-scoped or all-namespace calls
        if namespace is not None and req.namespace != namespace:
            continue
        if _rule_allows(rule, req):
            return True
    return False


def rbac_covers(rules: Any, record: Iterable[Any]) -> list[Request]:
    """The requests in ``record`` that ``rules`` do not allow (empty: fully covered)."""
    scoped = _rules_by_scope(rules)
    missing: list[Request] = []
    for raw in record:
        req = as_request(raw)
        if not _allows(scoped, req) and req not in missing:
            missing.append(req)
    return missing


def rbac_excess(rules: Any, record: Iterable[Any]) -> list[tuple[str, str, str]]:
    """Grants no request in ``record`` used: (group, resource, verb) triples, sorted.

    Wildcards are reported as such (``*``) when nothing matched them.
    """
    requests = [as_request(r) for r in record]
    unused: set[tuple[str, str, str]] = set()
    for namespace, rule in _rules_by_scope(rules):
        for group in rule.get("apiGroups") or []:
            for resource in rule.get("resources") or []:
                for verb in rule.get("verbs") or []:
                    single = {"apiGroups": [group], "resources": [resource], "verbs": [verb],
                              "resourceNames": rule.get("resourceNames")}
                    if not any(_allows([(namespace, single)], req) for req in requests):
                        unused.add((group, resource, verb))
    return sorted(unused)
