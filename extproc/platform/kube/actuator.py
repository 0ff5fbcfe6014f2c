"""Commit swap steps by setting a member InferenceService's ``spec.replicas``.

Why a merge patch of ``spec.replicas`` and not the ``/scale`` subresource: it needs only the
``patch`` verb on ``inferenceservices`` (no extra ``inferenceservices/scale`` RBAC rule), and it
writes the very field LLMKube's operator reconciles, whichever InferenceService CRD is
installed. Every patch names the resourceVersion the caller decided on (``fencing.py``): the
API server applies it only if nobody changed the member since, else answers 409 Conflict.

One attempt per call: the runtime's scale worker (``runtime/driver.py``) is the one retry
loop, because only it knows whether the replicas it wanted are still the ones it wants.
"""

from __future__ import annotations

from extproc.logs import get_logger
from extproc.platform.kube._calls import POOLS, SERVICES, counted, custom_path, resource_version_of
from extproc.platform.kube.rest import ApiError, KubeClient
from extproc.platform.contract import WriteRefused

log = get_logger(__name__)


class MemberMissing(WriteRefused):
    """The member InferenceService does not exist (the API answered 404)."""

    def __init__(self, namespace: str, member: str) -> None:
        super().__init__(f"InferenceService {namespace}/{member} not found")
        self.namespace = namespace
        self.member = member


class Actuator:
    """Scales member InferenceServices up and down."""

    def __init__(self, api_client: KubeClient) -> None:
        self._api = api_client

    async def scale(self, namespace: str, member: str, replicas: int,
                    resource_version: str = "") -> str:
        """Set the member's replicas once, only if it is still at ``resource_version`` (none:
        unconditionally); its new resourceVersion. ``MemberMissing`` on 404, else ApiError."""
        body: dict = {"spec": {"replicas": replicas}}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        answered = await self._patch(namespace, member, body)
        log.info("member scaled", namespace=namespace, member=member, replicas=replicas,
                 resource_version=resource_version)
        return resource_version_of(answered)

    async def stamp(self, namespace: str, member: str, annotation: str, value: str) -> str:
        """Set one annotation on the member unconditionally (a leader's fence); its new
        resourceVersion. Only metadata changes: the generation and the replicas stay."""
        answered = await self._patch(namespace, member,
                                     {"metadata": {"annotations": {annotation: value}}})
        return resource_version_of(answered)

    async def stamp_pool(self, namespace: str, pool: str, annotation: str, value: str) -> str:
        """The same stamp on a ModelPool (its status shares the object's resourceVersion, so
        this fences status patches too); its new resourceVersion, "" if the pool is gone."""
        try:
            answered = await counted("patch", POOLS, self._api.call(
                "PATCH", custom_path(namespace, POOLS, pool),
                body={"metadata": {"annotations": {annotation: value}}}))
        except ApiError as exc:
            if exc.status == 404:
                return ""
            raise
        return resource_version_of(answered)

    async def trigger(self, namespace: str, member: str, resource_version: str) -> None:
        """Replicas 1 only if the object is still at ``resource_version`` (else 409 Conflict).

        The precondition is what makes a trigger safe beside LLMKube: if the reconciler (or
        another replica) changed the member since we looked, the patch fails and the next
        attempt decides again on the fresher view instead of undoing their change.
        """
        body: dict = {"spec": {"replicas": 1}}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        await self._patch(namespace, member, body)
        log.info("swap triggered", namespace=namespace, member=member,
                 resource_version=resource_version)

    async def _patch(self, namespace: str, member: str, body: dict) -> dict:
        """PATCH the member's InferenceService; the object answered. A 404 is ``MemberMissing``."""
        try:
            return await counted("patch", SERVICES, self._api.call(
                "PATCH", custom_path(namespace, SERVICES, member), body=body))
        except ApiError as exc:
            if exc.status == 404:
                raise MemberMissing(namespace, member) from None
            raise
