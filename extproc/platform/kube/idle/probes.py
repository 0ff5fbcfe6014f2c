"""Idle probes for every runtime a pool member may run, and the choice of one per member.

Semantics follow LLMKube's ModelPool reconciler, so a member behaves the same under either
controller: llama.cpp is idle when no ``/slots`` entry is processing; the metric annotation
sums a gauge over its label sets and is idle at or below the threshold (default 0); the
endpoint annotation is idle on any 2xx. vLLM is stricter than LLMKube's (which reads only
``vllm:num_requests_running``): a waiting request is about to run, so waiting must be 0 too.
Every probe fails closed: an answer that cannot be read is None, and the caller defers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from extproc.logs import get_logger
from extproc.platform.kube.idle.fetch import fetch
from extproc.platform.kube.idle.prometheus import metric_sum
from extproc.platform.kube.idle.slots import probe_idle
from extproc.names import IDLE_ENDPOINT, IDLE_METRIC, IDLE_METRIC_PATH, IDLE_METRIC_THRESHOLD

log = get_logger(__name__)

VLLM_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")

SLOTS, VLLM, METRIC, ENDPOINT = "llama.cpp-slots", "vllm-metrics", "metric", "endpoint"
# InferenceService spec.runtime values with a probe of their own ("" = LLMKube's default).
_NATIVE = {"": SLOTS, "llamacpp": SLOTS, "vllm": VLLM}


@dataclass(frozen=True, slots=True)
class IdleProbe:
    """How to ask one member whether it is idle: which kind, at which path."""

    kind: str
    path: str
    metrics: tuple[str, ...] = ()
    threshold: float = 0.0


def choose_probe(annotations: Mapping[str, str], runtime: str) -> IdleProbe | None:
    """The probe for a member from its annotations and ``spec.runtime``; None: none applies.

    The metric annotation wins over everything: it is the operator's precise signal. The
    endpoint annotation is used only by runtimes without a probe of their own, because a
    health check answers 2xx while busy and must never replace a precise native probe.
    """
    if metric := (annotations.get(IDLE_METRIC) or "").strip():
        return IdleProbe(METRIC, annotations.get(IDLE_METRIC_PATH) or "/metrics", (metric,),
                         _threshold(annotations.get(IDLE_METRIC_THRESHOLD)))
    native = _NATIVE.get(runtime)
    if native == SLOTS:
        return IdleProbe(SLOTS, "/slots")
    if native == VLLM:
        return IdleProbe(VLLM, "/metrics", VLLM_GAUGES)
    if IDLE_ENDPOINT in annotations:
        return IdleProbe(ENDPOINT, annotations[IDLE_ENDPOINT] or "/")
    return None


def _threshold(raw: str | None) -> float:
    """The metric threshold; 0 when unset or unreadable, as LLMKube does (the strictest)."""
    try:
        return float(raw) if raw else 0.0
    except ValueError:
        return 0.0


def probe_url(base: str, probe: IdleProbe) -> str:
    """Where to send ``probe``: ``base`` itself for llama.cpp (the configured URL template has
    always named its ``/slots``), else ``probe.path`` on the scheme, host and port of ``base``."""
    if probe.kind == SLOTS:
        return base
    parts = urlsplit(base)
    path = probe.path if probe.path.startswith("/") else "/" + probe.path
    return f"{parts.scheme}://{parts.netloc}{path}"


async def run_probe(session: aiohttp.ClientSession, probe: IdleProbe, base: str,
                    timeout: float) -> bool | None:
    """Ask the member at ``base`` with ``probe``: True idle, False busy, None unknown."""
    url = probe_url(base, probe)
    if probe.kind == SLOTS:
        return await probe_idle(session, url, timeout)
    answer = await fetch(session, url, timeout)
    if answer is None:
        return None
    status, body = answer
    if probe.kind == ENDPOINT:
        return 200 <= status < 300
    if status != 200:
        log.warning("idle probe answered non-200", url=url, status=status)
        return None
    text = body.decode("utf-8", "replace")
    sums = [metric_sum(text, name) for name in probe.metrics]
    if any(value is None for value in sums):
        log.warning("idle probe metric missing", url=url, metrics=list(probe.metrics))
        return None
    total = sum(value for value in sums if value is not None)
    return total <= probe.threshold
