"""Shared plumbing for API calls: request counting and error classification."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar
from urllib.parse import quote

import aiohttp

from extproc.metrics import KUBE_REQUESTS
from extproc.platform.kube.rest import ApiError

T = TypeVar("T")

GROUP = "inference.llmkube.dev"
VERSION = "v1alpha1"
POOLS = "modelpools"
SERVICES = "inferenceservices"

# Connection-level failures: the API server is down, restarting, or the network blinked.
TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


def status_code(exc: BaseException) -> str:
    """The HTTP status of a failed call as a metric label ("error" when none arrived)."""
    if isinstance(exc, ApiError) and exc.status:
        return str(exc.status)
    return "error"


def describe(exc: BaseException) -> str:
    """A one-line description of an API or transport error for the log."""
    if isinstance(exc, ApiError):
        return f"{exc.status} {exc.reason}"
    return repr(exc)


def retryable(exc: BaseException) -> bool:
    """True for failures a retry can cure: conflicts, throttling, 5xx and transport errors."""
    if isinstance(exc, ApiError):
        status = exc.status or 0
        return status in (409, 429) or status >= 500
    return isinstance(exc, TRANSPORT_ERRORS)


async def counted(verb: str, resource: str, call: Awaitable[tuple[int, T]]) -> T:
    """Await one ``KubeClient.call`` and count it in ``KUBE_REQUESTS``; its decoded body."""
    try:
        status, body = await call
    except BaseException as exc:
        if not isinstance(exc, asyncio.CancelledError):
            KUBE_REQUESTS.labels(verb, resource, status_code(exc)).inc()
        raise
    KUBE_REQUESTS.labels(verb, resource, str(status)).inc()
    return body


def segment(text: str) -> str:
    """``text`` as one URL path segment, whatever it holds: every reserved character is
    escaped, and so are dots when the segment is all dots (a client would fold ``..``)."""
    quoted = quote(text, safe="")
    return quoted.replace(".", "%2E") if quoted.strip(".") == "" else quoted


def custom_path(namespace: str, plural: str, name: str = "", subresource: str = "") -> str:
    """The URL path of our custom resources (all of them, one, or one's subresource)."""
    path = f"/apis/{GROUP}/{VERSION}"
    path += f"/namespaces/{segment(namespace)}/{plural}" if namespace else f"/{plural}"
    return path + "".join(f"/{segment(part)}" for part in (name, subresource) if part)


def resource_version_of(obj: object) -> str:
    """An API object's metadata.resourceVersion ("" when absent)."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return str(meta.get("resourceVersion") or "") if isinstance(meta, dict) else ""
