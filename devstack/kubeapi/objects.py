"""What each write means: metadata the server owns, status isolation, generation, conflicts, scale.

This layer turns create/update/patch/delete requests into new stored objects and decides which
errors a real API server would answer with. It never touches HTTP.

Choices worth knowing:
- For types with the status subresource, writes to the main resource keep the stored .status and
  writes to /status change only .status (the real server's status strategy). A create drops
  .status (Pods and Namespaces get the server's initial status) unless `keep_status` is set by
  an in-process seeding helper.
- `generation` exists on CRD objects only; it is bumped when anything outside metadata changes,
  and for types with the status subresource also outside .status.
- Deletion is immediate unless the object has finalizers: then deletionTimestamp is set and the
  object goes away when a later write empties metadata.finalizers. Pods get no grace period.
- A write that changes nothing is answered with the stored object and no new version or event.
- A write that names its field manager (``manager``: the handler takes it from the request as
  the real server does) records it in metadata.managedFields (``managed.py``).
"""

from __future__ import annotations

import copy
import datetime
import json
import secrets
import string
import uuid
from typing import Any

import yaml

from devstack.kubeapi import errors, managed, patches
from devstack.kubeapi.resources import ResourceType, apply_defaults
from devstack.kubeapi.store import Store

# metadata the server owns: client values are ignored on every write
SERVER_METADATA = ("uid", "creationTimestamp", "resourceVersion", "generation", "deletionTimestamp",
                   "deletionGracePeriodSeconds", "selfLink", "managedFields")
_NAME_CHARS = string.ascii_lowercase + string.digits


def now() -> str:
    """An RFC 3339 timestamp with seconds precision, as metadata carries."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def _path_get(obj: Any, dotted: str) -> Any:
    for part in dotted.strip(".").split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def _path_set(obj: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.strip(".").split(".")
    for part in parents:
        obj = obj.setdefault(part, {})
    obj[last] = value


def _without(obj: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in keys}


def decode_body(raw: bytes, content_type: str) -> Any:
    """The request body as data: YAML for apply patches, JSON otherwise; 415 for protobuf and the like."""
    if raw and "json" not in content_type and "yaml" not in content_type:
        raise errors.unsupported_media(content_type)
    try:
        return yaml.safe_load(raw) if content_type == patches.APPLY else json.loads(raw or b"null")
    except (ValueError, yaml.YAMLError) as exc:
        raise errors.bad_request(f"the request body could not be decoded: {exc}") from None


class ObjectApi:
    """The semantics of the object verbs on top of a `Store`."""

    def __init__(self, store: Store):
        self.store = store

    def current(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        """The stored object, or 404."""
        obj = self.store.get(rt, namespace if rt.namespaced else None, name)
        if obj is None:
            raise errors.not_found(rt.display, rt.kind, name)
        return obj

    def create(self, rt: ResourceType, namespace: str | None, body: Any, *,
               dry_run: bool = False, keep_status: bool = False, manager: str = "",
               operation: str = "Update") -> dict[str, Any]:
        """Create an object; 409 AlreadyExists if its name is taken."""
        if not isinstance(body, dict):
            raise errors.bad_request("the object must be a JSON object")
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if rt.namespaced:
            if namespace and meta.get("namespace") and meta["namespace"] != namespace:
                raise errors.bad_request("the namespace of the provided object does not match the namespace "
                                         "sent on the request")
            meta["namespace"] = namespace or meta.get("namespace") or "default"
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise errors.invalid(rt.display, rt.kind, "", "metadata.name: Required value: name or "
                                     "generateName is required")
            meta["name"] = meta["generateName"] + "".join(secrets.choice(_NAME_CHARS) for _ in range(5))
        if self.store.get(rt, meta.get("namespace"), meta["name"]) is not None:
            raise errors.already_exists(rt.display, rt.kind, meta["name"])
        for field in SERVER_METADATA:
            meta.pop(field, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now()
        if rt.crd:
            meta["generation"] = 1
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        if rt.status and not keep_status:
            obj.pop("status", None)
        if rt.initial_status is not None and "status" not in obj:
            obj["status"] = copy.deepcopy(rt.initial_status)
        apply_defaults(rt.schema, obj)
        if manager:
            meta["managedFields"] = managed.record(None, obj, manager, operation, None, now())
        return obj if dry_run else self.store.put(rt, obj)

    def update(self, rt: ResourceType, namespace: str | None, name: str, body: Any, *,
               subresource: str | None = None, dry_run: bool = False,
               manager: str = "") -> dict[str, Any]:
        """PUT: replace the object (or its status); the body's resourceVersion must be current."""
        current = self.current(rt, namespace, name)
        if not isinstance(body, dict):
            raise errors.bad_request("the object must be a JSON object")
        meta = _meta(body)
        if meta.get("name") not in (None, name):
            raise errors.bad_request(f"the name of the object ({meta['name']}) does not match the name on the URL "
                                     f"({name})")
        if not meta.get("resourceVersion") and rt.crd:
            # custom resources do not allow unconditional updates (the real server says the same)
            raise errors.invalid(rt.display, rt.kind, name,
                                 "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update")
        self._check_version(rt, current, meta.get("resourceVersion"))
        return self._commit(rt, current, body, subresource, dry_run, (manager, "Update", subresource))

    def patch(self, rt: ResourceType, namespace: str | None, name: str, content_type: str, raw: bytes, *,
              subresource: str | None = None, dry_run: bool = False, manager: str = "") -> dict[str, Any]:
        """PATCH in any supported format; a resourceVersion carried by the patch must be current.

        Strategic merge patch is refused on custom resources (415, as a real server does) and
        applied as a merge patch on built-in kinds (lists are replaced, not merged by key);
        an apply patch is a merge patch that creates the object when missing (no field ownership).
        """
        if content_type == patches.STRATEGIC and rt.crd:
            # as a real API server: custom resources have no patch strategies, so a client that
            # sends strategic merge (the Python client's default for dict bodies) must fail here
            raise errors.unsupported_media(content_type)
        body = decode_body(raw, content_type)
        operation = "Apply" if content_type == patches.APPLY else "Update"
        if content_type == patches.APPLY and self.store.get(rt, namespace if rt.namespaced else None, name) is None:
            return self.create(rt, namespace, body, dry_run=dry_run, manager=manager, operation=operation)
        current = self.current(rt, namespace, name)
        desired = self._patched(current, content_type, body)
        self._check_version(rt, current, _meta(desired).get("resourceVersion"))
        return self._commit(rt, current, desired, subresource, dry_run, (manager, operation, subresource))

    @staticmethod
    def _patched(current: dict[str, Any], content_type: str, body: Any) -> Any:
        if content_type == patches.JSON_PATCH:
            return patches.json_patch(current, body)
        if content_type in (patches.MERGE, patches.STRATEGIC, patches.APPLY):
            if not isinstance(body, dict):
                raise errors.bad_request("a merge patch must be a JSON object")
            return patches.merge_patch(current, body)
        raise errors.unsupported_media(content_type)

    def delete(self, rt: ResourceType, namespace: str | None, name: str, options: Any = None, *,
               dry_run: bool = False) -> dict[str, Any]:
        """Delete now, or mark for deletion while finalizers remain; honours DeleteOptions preconditions."""
        current = self.current(rt, namespace, name)
        preconditions = (options.get("preconditions") or {}) if isinstance(options, dict) else {}
        if preconditions.get("uid") not in (None, _meta(current)["uid"]):
            raise errors.conflict(rt.display, rt.kind, name, "Precondition failed: UID in precondition: "
                                  f"{preconditions['uid']}, UID in object meta: {_meta(current)['uid']}")
        self._check_version(rt, current, preconditions.get("resourceVersion"))
        if dry_run:
            return current
        if _meta(current).get("finalizers"):
            if _meta(current).get("deletionTimestamp"):
                return current
            marked = copy.deepcopy(current)
            marked["metadata"]["deletionTimestamp"] = now()
            marked["metadata"]["deletionGracePeriodSeconds"] = 0
            if rt.crd:
                marked["metadata"]["generation"] = current["metadata"].get("generation", 0) + 1
            return self.store.put(rt, marked)
        return self.store.remove(rt, _meta(current).get("namespace"), name)

    def get_scale(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        """The autoscaling/v1 Scale view of an object whose CRD declares /scale."""
        assert rt.scale is not None  # the handler routes /scale only for such types
        obj = self.current(rt, namespace, name)
        meta = obj["metadata"]
        status: dict[str, Any] = {"replicas": _path_get(obj, rt.scale.status_replicas_path) or 0}
        if rt.scale.label_selector_path and _path_get(obj, rt.scale.label_selector_path):
            status["selector"] = _path_get(obj, rt.scale.label_selector_path)
        return {
            "kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                         if k in meta},
            "spec": {"replicas": _path_get(obj, rt.scale.spec_replicas_path) or 0},
            "status": status,
        }

    def write_scale(self, rt: ResourceType, namespace: str | None, name: str, content_type: str | None,
                    raw: bytes, *, dry_run: bool = False, manager: str = "") -> dict[str, Any]:
        """PUT (content_type None) or PATCH the Scale; only spec.replicas reaches the object."""
        assert rt.scale is not None
        scale = self.get_scale(rt, namespace, name)
        body = decode_body(raw, content_type or "application/json")
        desired = body if content_type is None else self._patched(scale, content_type, body)
        if not isinstance(desired, dict):
            raise errors.bad_request("the Scale must be a JSON object")
        self._check_version(rt, self.current(rt, namespace, name), _meta(desired).get("resourceVersion"))
        replicas = (desired.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise errors.invalid(rt.display, "Scale", name, f"spec.replicas: Invalid value: {replicas!r}")
        current = self.current(rt, namespace, name)
        scaled = copy.deepcopy(current)
        _path_set(scaled, rt.scale.spec_replicas_path, replicas)
        self._commit(rt, current, scaled, None, dry_run, (manager, "Update", "scale"))
        return scale if dry_run else self.get_scale(rt, namespace, name)

    @staticmethod
    def _check_version(rt: ResourceType, current: dict[str, Any], wanted: Any) -> None:
        if wanted not in (None, "") and str(wanted) != current["metadata"]["resourceVersion"]:
            raise errors.conflict(rt.display, rt.kind, current["metadata"]["name"])

    def _commit(self, rt: ResourceType, current: dict[str, Any], desired: Any, subresource: str | None,
                dry_run: bool, writer: tuple[str, str, str | None] = ("", "", None)) -> dict[str, Any]:
        if not isinstance(desired, dict):
            raise errors.bad_request("the object must be a JSON object")
        if subresource == "status":
            new = copy.deepcopy(current)
            if "status" in desired:
                new["status"] = copy.deepcopy(desired["status"])
            else:
                new.pop("status", None)
        else:
            new = copy.deepcopy(desired)
            if rt.status:
                new.pop("status", None)
                if "status" in current:
                    new["status"] = copy.deepcopy(current["status"])
            meta = new["metadata"] = dict(_meta(new))
            for field in (*SERVER_METADATA, "name", "namespace"):
                meta.pop(field, None)
                if field in current["metadata"]:
                    meta[field] = current["metadata"][field]
        new["apiVersion"], new["kind"] = rt.api_version, rt.kind
        apply_defaults(rt.schema, new)
        if new == current:
            return current
        if rt.crd:
            ignored = ("metadata", "status") if rt.status else ("metadata",)
            if _without(new, *ignored) != _without(current, *ignored):
                new["metadata"]["generation"] = current["metadata"].get("generation", 0) + 1
        manager, operation, tag = writer
        if manager:
            new["metadata"]["managedFields"] = managed.record(current, new, manager, operation, tag, now())
        if dry_run:
            return new
        meta = new["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            # the write that drops the last finalizer completes the deletion (one DELETED event)
            return self.store.remove(rt, meta.get("namespace"), meta["name"], final=new)
        return self.store.put(rt, new)
