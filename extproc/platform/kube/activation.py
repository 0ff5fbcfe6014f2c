"""Reading a ModelPool's scheduling annotations: its default activation, its members'
fallbacks, and the priorities of request objectives (``priorities: "critical=10,batch=-5"``).

``modelpool.inference.llmkube.dev/activation: IfIdle`` makes IfIdle the pool's default (Wait
otherwise; a request's ``x-modelpool-activation`` header still decides for itself).
``modelpool.inference.llmkube.dev/fallbacks: "coder=coder-small,judge=judge-lite:8000"`` names,
per member, the Service (in the pool's namespace; port 8080 unless given) that an IfIdle
request goes to when the incumbent is busy: another model that is always up, or an
ExternalName Service in front of an external OpenAI-compatible backend. Its routing value is
``fallback.<service>.<namespace>`` (an HTTPRoute rule and an Envoy cluster; ``render-routes``
renders both).

No I/O and no state; bad entries are dropped and named in ``problems`` (the pool's status).
"""

from __future__ import annotations

from typing import Any

from extproc.policy.ifidle import WAIT, parse
from extproc.names import ACTIVATION_ANNOTATION, FALLBACKS_ANNOTATION, PRIORITIES_ANNOTATION

FALLBACK_PORT = 8080


def fallback_value(service: str, namespace: str) -> str:
    """The routing value (Envoy cluster, HTTPRoute header match) of a fallback Service."""
    return f"fallback.{service}.{namespace}"


def activation(annotations: dict[str, Any], problems: list[str]) -> str:
    """The pool's default activation (Wait when absent or invalid)."""
    raw = annotations.get(ACTIVATION_ANNOTATION)
    if raw is None or str(raw).strip() == "":
        return WAIT
    try:
        return parse(str(raw))
    except ValueError as exc:
        problems.append(f"annotation {ACTIVATION_ANNOTATION} {exc}; using {WAIT}")
        return WAIT


def fallback_backends(annotations: dict[str, Any], members: list[str] | tuple[str, ...],
                      problems: list[str]) -> dict[str, tuple[str, int]]:
    """member -> (Service, port) of its fallback, in the annotation's order."""
    backends: dict[str, tuple[str, int]] = {}
    for item in str(annotations.get(FALLBACKS_ANNOTATION) or "").split(","):
        if not item.strip():
            continue
        member, sep, target = (part.strip() for part in item.partition("="))
        service, colon, port = target.partition(":")
        if not sep or member not in members or not service or \
                (colon and not port.isdigit()):
            problems.append(f"annotation {FALLBACKS_ANNOTATION}: bad entry {item.strip()!r} "
                            "(want member=service or member=service:port for a member of the "
                            "pool); ignored")
            continue
        backends[member] = (service, int(port) if colon else FALLBACK_PORT)
    return backends


def priorities(annotations: dict[str, Any], problems: list[str]) -> dict[str, int]:
    """objective -> priority from ``critical=10,batch=-5`` (bad entries reported, dropped)."""
    found: dict[str, int] = {}
    for item in str(annotations.get(PRIORITIES_ANNOTATION) or "").split(","):
        if not item.strip():
            continue
        objective, sep, value = (part.strip() for part in item.partition("="))
        if sep and objective and value.lstrip("-").isdigit():
            found[objective] = int(value)
        else:
            problems.append(f"annotation {PRIORITIES_ANNOTATION}: bad entry {item.strip()!r} "
                            "(want objective=integer); ignored")
    return found
