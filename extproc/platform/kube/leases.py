"""coordination.k8s.io/v1 Leases over our `KubeClient`: read, create, renew, delete.

Every change is an update carrying the resourceVersion last read, so two writers can never both
win: the loser gets `LeaseConflict` (409) and must re-read. That precondition is the only fencing
the replicas rely on. A JSON payload (what the other replicas need to know) rides in one
annotation, so it is written in the same request as the renew. ``lease_name`` turns the
names the templates make into names the API server accepts.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import re
from typing import Any

from extproc.platform.kube._calls import counted, segment
from extproc.platform.kube.rest import ApiError, KubeClient
from extproc.names import PAYLOAD_ANNOTATION

RESOURCE = "leases"
_CONTENT_TYPE = "application/json"


# A Lease's name is a DNS-1123 subdomain: at most 253 characters, lower-case alphanumeric
# labels with inner "-", joined by ".".
MAX_NAME = 253
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_HASH_CHARS = 10


def lease_name(wanted: str) -> str:
    """``wanted`` itself when it is a valid Lease name; otherwise a valid name made from it.

    The made name is ``wanted`` lower-cased, with characters a name cannot hold turned into
    "-", cut to fit, then "-" and the first 10 hex digits of SHA-256(wanted): the same on
    every replica and every release, distinct for names that differ only past the cut.
    """
    if len(wanted) <= MAX_NAME and _SUBDOMAIN.fullmatch(wanted):
        return wanted
    digest = hashlib.sha256(wanted.encode()).hexdigest()[:_HASH_CHARS]
    labels = (part.strip("-") for part in re.sub(r"[^a-z0-9.-]", "-", wanted.lower()).split("."))
    stem = ".".join(p for p in labels if p)[:MAX_NAME - _HASH_CHARS - 1].rstrip(".-")
    return f"{stem}-{digest}" if stem else digest


class LeaseConflict(Exception):
    """A Lease write lost: the name is taken (create) or the resourceVersion is stale (update)."""


def micro_time(moment: datetime.datetime | None = None) -> str:
    """A MicroTime as the API server writes renewTime and acquireTime (UTC, microseconds)."""
    moment = moment or datetime.datetime.now(datetime.UTC)
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclasses.dataclass(frozen=True)
class Lease:
    """One Lease as read: what the replicas compare and what a renew must carry back."""

    name: str
    namespace: str
    resource_version: str
    holder: str
    duration_seconds: int
    transitions: int
    renew_time: str = ""
    acquire_time: str = ""
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    payload: Any = None

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> Lease:
        """The Lease in an API object; a payload that is not JSON reads as None."""
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        raw = (meta.get("annotations") or {}).get(PAYLOAD_ANNOTATION)
        try:
            payload = json.loads(raw) if raw else None
        except ValueError:
            payload = None  # another writer's garbage must not stop us reading the Lease
        return cls(name=meta["name"], namespace=meta.get("namespace", ""),
                   resource_version=meta.get("resourceVersion", ""),
                   holder=spec.get("holderIdentity") or "",
                   duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
                   transitions=int(spec.get("leaseTransitions") or 0),
                   renew_time=spec.get("renewTime") or "", acquire_time=spec.get("acquireTime") or "",
                   labels=dict(meta.get("labels") or {}), payload=payload)


def lease_object(name: str, namespace: str, *, holder: str, duration_seconds: int, transitions: int,
                 acquire_time: str, labels: dict[str, str], payload: Any,
                 resource_version: str = "") -> dict[str, Any]:
    """The API object of a Lease write; renewTime is now, the payload goes in its annotation."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if payload is not None:
        meta["annotations"] = {PAYLOAD_ANNOTATION: json.dumps(payload, sort_keys=True,
                                                              separators=(",", ":"))}
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration_seconds,
                     "leaseTransitions": transitions, "acquireTime": acquire_time,
                     "renewTime": micro_time()}}


class LeaseClient:
    """Lease calls in one namespace; 409 becomes `LeaseConflict`, other failures stay `ApiError`."""

    def __init__(self, client: KubeClient, namespace: str) -> None:
        self.client = client
        self.namespace = namespace

    def collection(self) -> str:
        """The URL of this namespace's Leases (to list or watch them)."""
        return self._path()

    def _path(self, name: str = "") -> str:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{segment(self.namespace)}/{RESOURCE}"
        return f"{path}/{segment(name)}" if name else path

    async def get(self, name: str) -> Lease | None:
        """The Lease, or None when there is none."""
        try:
            obj = await counted("get", RESOURCE, self.client.call("GET", self._path(name)))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return Lease.from_object(obj)

    async def list(self, label_selector: str) -> list[Lease]:
        """The Leases matching a label selector, ordered by name."""
        body = await counted("list", RESOURCE, self.client.call(
            "GET", self._path(), params={"labelSelector": label_selector}))
        return [Lease.from_object(item) for item in body.get("items") or ()]

    async def create(self, name: str, *, holder: str, duration_seconds: int,
                     labels: dict[str, str] | None = None, payload: Any = None) -> Lease:
        """Create a Lease held by `holder`; LeaseConflict when one of that name exists."""
        obj = lease_object(name, self.namespace, holder=holder, duration_seconds=duration_seconds,
                           transitions=0, acquire_time=micro_time(), labels=labels or {},
                           payload=payload)
        return await self._write("create", "POST", self._path(), obj)

    async def renew(self, lease: Lease, *, holder: str, duration_seconds: int, payload: Any = None,
                    transitions: int | None = None, acquire_time: str | None = None) -> Lease:
        """Rewrite `lease` from the version it was read at (renewTime now); LeaseConflict if stale.

        `transitions` and `acquire_time` default to the read ones (a renew); a takeover passes both.
        """
        obj = lease_object(lease.name, self.namespace, holder=holder, duration_seconds=duration_seconds,
                           transitions=lease.transitions if transitions is None else transitions,
                           acquire_time=lease.acquire_time if acquire_time is None else acquire_time,
                           labels=lease.labels, payload=payload,
                           resource_version=lease.resource_version)
        return await self._write("update", "PUT", self._path(lease.name), obj)

    async def delete(self, lease: Lease) -> None:
        """Delete `lease` if still at the version read (LeaseConflict if not); gone already is fine."""
        options = {"apiVersion": "v1", "kind": "DeleteOptions",
                   "preconditions": {"resourceVersion": lease.resource_version}}
        try:  # the answer is a Status, not the Lease (kube-apiserver returns no deleted Lease)
            await self._send("delete", "DELETE", self._path(lease.name), options)
        except ApiError as exc:
            if exc.status != 404:
                raise

    async def _write(self, verb: str, method: str, path: str, body: dict[str, Any]) -> Lease:
        return Lease.from_object(await self._send(verb, method, path, body))

    async def _send(self, verb: str, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return await counted(verb, RESOURCE, self.client.call(method, path, body=body,
                                                                  content_type=_CONTENT_TYPE))
        except ApiError as exc:
            if exc.status == 409:
                name = body["metadata"]["name"] if "metadata" in body else path.rsplit("/", 1)[-1]
                raise LeaseConflict(f"{verb} lease {self.namespace}/{name}: {exc.reason}") from exc
            raise
