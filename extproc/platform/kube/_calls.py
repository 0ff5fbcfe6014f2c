"""Shared plumbing for API calls: request counting and error classification."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

import aiohttp
from kubernetes.aio.client.exceptions import ApiException

from extproc.metrics import KUBE_REQUESTS

T = TypeVar("T")

GROUP = "inference.llmkube.dev"
VERSION = "v1alpha1"
POOLS = "modelpools"
SERVICES = "inferenceservices"

# Connection-level failures: the API server is down, restarting, or the network blinked.
TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


def status_code(exc: BaseException) -> str:
    """The HTTP status of a failed call as a metric label ("error" when none arrived)."""
    if isinstance(exc, ApiException) and exc.status:
        return str(exc.status)
    return "error"


def describe(exc: BaseException) -> str:
    """A one-line description of an API or transport error for the log."""
    if isinstance(exc, ApiException):
        return f"{exc.status} {exc.reason}"
    return repr(exc)


def retryable(exc: BaseException) -> bool:
    """True for failures a retry can cure: conflicts, throttling, 5xx and transport errors."""
    if isinstance(exc, ApiException):
        status = exc.status or 0
        return status in (409, 429) or status >= 500
    return isinstance(exc, TRANSPORT_ERRORS)


async def counted(verb: str, resource: str, call: Awaitable[T]) -> T:
    """Await one API call that returns an ``ApiResponse`` and count it in ``KUBE_REQUESTS``."""
    try:
        response = await call
    except BaseException as exc:
        if not isinstance(exc, asyncio.CancelledError):
            KUBE_REQUESTS.labels(verb, resource, status_code(exc)).inc()
        raise
    KUBE_REQUESTS.labels(verb, resource, str(getattr(response, "status_code", 200))).inc()
    return response
