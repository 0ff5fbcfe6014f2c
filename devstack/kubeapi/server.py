"""`KubeEmulator`: the in-memory Kubernetes API server on loopback, with helpers for tests."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from devstack.kubeapi import patches, selectors
from devstack.kubeapi.handler import KubeHandler
from devstack.kubeapi.objects import ObjectApi
from devstack.kubeapi.resources import ResourceType, builtin_types, load_crds
from devstack.kubeapi.routes import RequestRecord
from devstack.kubeapi.store import CLOSED, Store

# Any bearer token is accepted; a kubeconfig's token `<user>-token` names the caller in the record.
DEFAULT_USER = "kubeapi-emulator"


class KubeEmulator:
    """An in-memory Kubernetes API server: CRD-driven, strict about versions, served over plain HTTP."""

    def __init__(self, crd_paths: Iterable[str | os.PathLike[str]] = (), *,
                 namespaces: Iterable[str] = ("default",), history_limit: int = 10_000,
                 bookmark_interval: float = 1.0, watch_timeout: float = 1800.0, record_limit: int = 100_000):
        self.types: list[ResourceType] = builtin_types() + load_crds(crd_paths)
        self.store = Store(history_limit=history_limit)
        self.api = ObjectApi(self.store)
        self.handler = KubeHandler(api=self.api, types=self.types, bookmark_interval=bookmark_interval,
                                   watch_timeout=watch_timeout, record_limit=record_limit)
        self.url: str | None = None
        self._runner: web.ServerRunner | None = None
        for namespace in dict.fromkeys(namespaces):  # a name given twice is created once
            self.create("namespaces", {"metadata": {"name": namespace}})

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on host:port (0 picks a free port); returns and sets `url`."""
        if self._runner is not None:
            raise RuntimeError("the emulator is already running")
        # aiohttp's low-level server rather than kmock.Server: the latter also patches aiohttp's
        # resolver process-wide, which other clients in a test process must not inherit
        await self.handler.__aenter__()
        runner = web.ServerRunner(web.Server(self.handler), handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        self._runner = runner
        bound_host, bound_port = runner.addresses[0][:2]
        self.url = f"http://{bound_host}:{bound_port}"
        return self.url

    async def stop(self) -> None:
        """End open watches and stop listening."""
        if self._runner is None:
            return
        self.store.end_watches(CLOSED)
        runner, self._runner = self._runner, None
        await runner.cleanup()
        await self.handler.__aexit__(None, None, None)
        self.url = None

    async def __aenter__(self) -> KubeEmulator:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def requests(self) -> list[RequestRecord]:
        """Every resource request so far, oldest first (the live list; clear it to reset)."""
        return self.handler.record

    def requests_of(self, user: str) -> list[RequestRecord]:
        """The resource requests sent with the kubeconfig written for `user` (token `<user>-token`)."""
        return [entry for caller, entry, _body in self.handler.callers if caller == user]

    def compact(self, *, expire_watches: bool = True) -> int:
        """Forget the event history so older resourceVersions answer 410; returns the oldest resumable version."""
        return self.store.compact(expire_watches=expire_watches)

    def fail_writes(self, resource: str, count: int = 1) -> None:
        """Answer the next `count` writes to `resource` with 409 Conflict."""
        self.handler.fail_writes(self.resource_type(resource), count)

    def throttle_writes(self, resource: str, count: int = 1) -> None:
        """Answer the next `count` writes to `resource` with 429 TooManyRequests."""
        self.handler.throttle_writes(self.resource_type(resource), count)

    def set_unavailable(self, on: bool = True) -> None:
        """Play an unreachable API server (503 to everything but /_emulator/) until switched off."""
        self.handler.set_unavailable(on)

    def write_kubeconfig(self, path: str | os.PathLike[str], *, namespace: str = "default",
                         user: str = DEFAULT_USER) -> Path:
        """Write a kubeconfig for kubectl and the `kubernetes` clients (plain HTTP, token `<user>-token`)."""
        if self.url is None:
            raise RuntimeError("start the emulator before writing its kubeconfig")
        name = "kubeapi-emulator"
        config = {
            "apiVersion": "v1", "kind": "Config", "preferences": {}, "current-context": name,
            "clusters": [{"name": name, "cluster": {"server": self.url}}],
            "users": [{"name": name, "user": {"token": f"{user}-token"}}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}],
        }
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        # written whole then renamed: other processes poll for this file and read it at once
        partial = target.with_name(f".{target.name}.partial")
        partial.write_text(yaml.safe_dump(config, sort_keys=False))
        partial.replace(target)
        return target

    def resource_type(self, resource: str) -> ResourceType:
        """A served type by any kubectl-style name (`mpool`, `modelpools`, `ModelPool`, `pods`)."""
        return self.handler.find_type(resource)

    def _place(self, resource: str, namespace: str | None) -> tuple[ResourceType, str | None]:
        rt = self.resource_type(resource)
        return rt, (namespace or "default") if rt.namespaced else None

    def get(self, resource: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """A copy of the stored object, or None."""
        rt, namespace = self._place(resource, namespace)
        return copy.deepcopy(self.store.get(rt, namespace, name))

    def list(self, resource: str, namespace: str | None = None,
             label_selector: str | None = None) -> list[dict[str, Any]]:
        """Copies of the stored objects (all namespaces when `namespace` is None)."""
        rt = self.resource_type(resource)
        matches = selectors.label_selector(label_selector)
        return [copy.deepcopy(o) for o in self.store.items(rt, namespace) if matches(o)]

    def create(self, resource: str, obj: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        """Create an object; unlike the HTTP API it keeps a given .status (for seeding tests)."""
        rt = self.resource_type(resource)
        namespace = namespace or (obj.get("metadata") or {}).get("namespace")
        return copy.deepcopy(self.api.create(rt, namespace, dict(obj), keep_status=True))

    def patch(self, resource: str, name: str, patch: Mapping[str, Any], namespace: str | None = None, *,
              subresource: str | None = None) -> dict[str, Any]:
        """Merge-patch an object (or its `status`) with the same rules as the HTTP API."""
        rt, namespace = self._place(resource, namespace)
        raw = json.dumps(dict(patch)).encode()
        obj = self.api.patch(rt, namespace, name, patches.MERGE, raw, subresource=subresource)
        return copy.deepcopy(obj)

    def delete(self, resource: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        """Delete an object (or mark it, while it has finalizers); returns its last state."""
        rt, namespace = self._place(resource, namespace)
        return copy.deepcopy(self.api.delete(rt, namespace, name))
