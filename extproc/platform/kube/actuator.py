"""Commit swap steps by setting a member InferenceService's ``spec.replicas``.

Why a merge patch of ``spec.replicas`` and not the ``/scale`` subresource: it needs only the
``patch`` verb on ``inferenceservices`` (no extra ``inferenceservices/scale`` RBAC rule), and it
writes the very field LLMKube's operator reconciles, whichever InferenceService CRD is
installed. A merge patch carries no resourceVersion, so it cannot lose a race on a stale read;
it is retried only for failures a retry can cure (409 from admission or fault injection, 429,
5xx, connection errors).
"""

from __future__ import annotations

import asyncio

from extproc.logs import get_logger
from extproc.platform.kube._calls import (
    SERVICES,
    Backoff,
    counted,
    custom_path,
    describe,
    retryable,
    status_code,
)
from extproc.platform.kube.rest import ApiError, KubeClient

log = get_logger(__name__)


class MemberMissing(Exception):
    """The member InferenceService does not exist (the API answered 404)."""

    def __init__(self, namespace: str, member: str) -> None:
        super().__init__(f"InferenceService {namespace}/{member} not found")
        self.namespace = namespace
        self.member = member


class Actuator:
    """Scales member InferenceServices up and down."""

    def __init__(self, api_client: KubeClient, *, backoff_initial: float = 0.2,
                 backoff_max: float = 5.0) -> None:
        self._api = api_client
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max

    async def scale(self, namespace: str, member: str, replicas: int,
                    deadline: float | None = None) -> None:
        """Set the member's replicas, retrying until success, ``deadline`` or cancellation.

        ``deadline`` is an event-loop time (``loop.time()``); past it the last error is raised.
        A missing member raises ``MemberMissing`` at once; other client errors are raised too.
        """
        loop = asyncio.get_running_loop()
        backoff = Backoff(self._backoff_initial, self._backoff_max)
        body = {"spec": {"replicas": replicas}}
        attempt = 0
        while True:
            attempt += 1
            try:
                await counted("patch", SERVICES, self._api.call(
                    "PATCH", custom_path(namespace, SERVICES, member), body=body))
            except Exception as exc:
                if isinstance(exc, ApiError) and exc.status == 404:
                    log.warning("scale target missing", namespace=namespace, member=member,
                                replicas=replicas)
                    raise MemberMissing(namespace, member) from None
                delay = backoff.next_delay()
                if not retryable(exc) or (deadline is not None and loop.time() + delay > deadline):
                    log.error("scale failed", namespace=namespace, member=member,
                              replicas=replicas, attempt=attempt, code=status_code(exc),
                              error=describe(exc))
                    raise
                log.warning("scale failed, retrying", namespace=namespace, member=member,
                            replicas=replicas, attempt=attempt, code=status_code(exc),
                            retry_in=round(delay, 3))
                await asyncio.sleep(delay)
                continue
            log.info("member scaled", namespace=namespace, member=member, replicas=replicas,
                     attempt=attempt)
            return

