"""The HTTP side: a strict subclass of kmock's Kubernetes scaffold.

kmock serves everything that is not a resource URL: its DSL reactions and fallbacks give the
discovery documents (/api, /apis, /apis/<group>, /version, OpenAPI) and Status rendering of
unexpected errors. This subclass claims every resource URL before kmock parses it, serves it
from `ObjectApi`/`Store` with the real server's codes, records each resource request as RBAC
sees it, and carries the fault switches.
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs
import kmock
from aiohttp import web

from devstack.kubeapi import discovery, errors, managed, routes, selectors, tables
from devstack.kubeapi.objects import ObjectApi, decode_body
from devstack.kubeapi.resources import ResourceType
from devstack.kubeapi.routes import RequestRecord, Target
from devstack.kubeapi.store import CLOSED
from devstack.kubeapi.watch import WatchOptions, present, serve_watch

DEBUG_PREFIX = "/_emulator/"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
_KMOCK_REQUEST_KEEP = 1_000  # kmock keeps every parsed request with its body; a long demo must not grow


def json_response(body: Any, status: int = 200) -> web.Response:
    """A JSON response as the API server sends it."""
    return web.Response(body=json.dumps(body).encode(), status=status, content_type="application/json")


async def _written_body(request: web.BaseRequest) -> Any:
    """The JSON a write sent (None if none or not JSON): kept so tests can read what a caller
    wrote, e.g. that an activator's patch carried replicas 1 and a resourceVersion only."""
    try:
        raw = await request.read()  # aiohttp keeps it: the handler reads it again
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def status_response(exc: errors.ApiError) -> web.Response:
    """The Status answer for an API failure."""
    return json_response(exc.status(), exc.code)


def _int_param(params: Any, name: str) -> int | None:
    value = params.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise errors.bad_request(f"invalid {name}: {value!r}") from None


@attrs.define(kw_only=True)
class KubeHandler(kmock.KubernetesScaffold):
    """kmock's Kubernetes scaffold serving resource URLs strictly from an `ObjectApi`."""

    api: ObjectApi
    types: list[ResourceType]
    bookmark_interval: float = 1.0
    watch_timeout: float = 1800.0
    record_limit: int = 100_000
    record: list[RequestRecord] = attrs.field(factory=list, init=False)
    # (caller, request): the same requests with who sent them, so a suite can check one client's
    # calls (the ext_proc's) against its RBAC rules while others share the server
    # (caller, request, JSON body of a write or None)
    callers: list[tuple[str, RequestRecord, Any]] = attrs.field(factory=list, init=False)
    unavailable: bool = attrs.field(default=False, init=False)
    write_faults: dict[tuple[str, str], int] = attrs.field(factory=dict, init=False)
    throttled: dict[tuple[str, str], int] = attrs.field(factory=dict, init=False)
    _by_url: dict[tuple[str, str, str], ResourceType] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for rt in self.types:
            self._by_url[(rt.group, rt.version, rt.plural)] = rt
            self.resources[kmock.resource(rt.group, rt.version, rt.plural)] = kmock.ResourceInfo(
                namespaced=rt.namespaced, kind=rt.kind, singular=rt.singular,
                verbs=set(discovery.VERBS),
                shortnames=set(rt.short_names), categories=set(rt.categories), subresources=set(rt.subresources),
            )
        self.fallback["get /openapi/v3"] << discovery.openapi_v3_index(self.types)
        self.fallback["get", re.compile(r"/openapi/v3/apis?/.+")] << self._serve_openapi_document

    async def _serve_version(self, request: kmock.Request) -> kmock.Payload:
        gv = request.url.path.strip("/").removeprefix("apis/").removeprefix("api/")
        types = [rt for rt in self.types if rt.api_version == gv]
        if not types:
            raise errors.no_such_path()
        return discovery.resource_list(gv, types)

    async def _serve_openapi_document(self, request: kmock.Request) -> kmock.Payload:
        prefix = request.url.path.removeprefix("/openapi/v3/")
        types = [rt for rt in self.types if discovery.group_version(rt) == prefix]
        if not types:
            raise errors.no_such_path()
        return discovery.openapi_v3_document(types)

    async def _serve_server_version(self, request: kmock.Request) -> kmock.Payload:
        return {"major": "1", "minor": "32", "gitVersion": "v1.32.0-kubeapi-emulator", "gitCommit": "",
                "gitTreeState": "clean", "buildDate": "2024-12-11T00:00:00Z", "goVersion": "go1.23",
                "compiler": "gc", "platform": "linux/amd64"}

    async def _render_error(self, exc: Exception) -> web.StreamResponse:
        if isinstance(exc, errors.ApiError):
            return status_response(exc)
        return await super()._render_error(exc)

    def find_type(self, name: str) -> ResourceType:
        """A served type by any kubectl-style name: `mpool`, `modelpools`, `ModelPool`,
        `leases.coordination.k8s.io`."""
        wanted = name.lower()
        for rt in self.types:
            if wanted in rt.names():
                return rt
        raise KeyError(f"no served resource is called {name!r}")

    def set_unavailable(self, on: bool) -> None:
        """Answer 503 to every non-debug request while on; switching on ends open watches like a dropped server."""
        self.unavailable = on
        if on:
            self.api.store.end_watches(CLOSED)

    def fail_writes(self, rt: ResourceType, count: int) -> None:
        """Answer the next `count` writes (create/update/patch/delete, any subresource) to `rt` with 409 Conflict."""
        self.write_faults[rt.storage_key] = count

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        """aiohttp's entry point: resource and debug URLs are served here, the rest by kmock."""
        # Resource URLs never reach kmock's own request parser: it fails on /api/v1/namespaces.
        path = request.path
        if path.startswith(DEBUG_PREFIX):
            return await self._serve_debug(request, path.removeprefix(DEBUG_PREFIX))
        target = routes.parse(path)
        verb = routes.verb(request.method, target, request.query) if target else ""
        if target is not None:
            entry = routes.record_of(verb, target)
            self.record.append(entry)
            body = await _written_body(request) if verb in ("create", "update", "patch") else None
            self.callers.append((routes.caller(request.headers.get("Authorization")), entry,
                                 body))
            if len(self.record) > self.record_limit:
                del self.record[: len(self.record) - self.record_limit]
            if len(self.callers) > self.record_limit:
                del self.callers[: len(self.callers) - self.record_limit]
        if self.unavailable:
            return status_response(errors.unavailable())
        if target is None:
            if len(self._requests) > 2 * _KMOCK_REQUEST_KEEP:
                del self._requests[:-_KMOCK_REQUEST_KEEP]
            return await super().__call__(request)
        try:
            return await self._serve_resource(request, target, verb)
        except errors.ApiError as exc:
            return status_response(exc)

    def _resolve(self, target: Target) -> ResourceType:
        rt = self._by_url.get((target.group, target.version, target.plural))
        if rt is None or (target.namespace is not None and not rt.namespaced):
            raise errors.no_such_path()
        if target.subresource is not None and target.subresource not in rt.subresources:
            raise errors.no_such_path()
        return rt

    def throttle_writes(self, rt: ResourceType, count: int) -> None:
        """Answer the next `count` writes to `rt` with 429 TooManyRequests (API Priority and Fairness)."""
        self.throttled[rt.storage_key] = count

    def _inject_fault(self, rt: ResourceType, verb: str, target: Target) -> None:
        if verb in WRITE_VERBS and self.throttled.get(rt.storage_key, 0) > 0:
            self.throttled[rt.storage_key] -= 1
            raise errors.too_many_requests()
        remaining = self.write_faults.get(rt.storage_key, 0)
        if verb in WRITE_VERBS and remaining > 0:
            self.write_faults[rt.storage_key] = remaining - 1
            raise errors.conflict(rt.display, rt.kind, target.name or "", "injected conflict (emulator fault)")

    async def _serve_resource(self, request: web.BaseRequest, target: Target, verb: str) -> web.StreamResponse:
        rt = self._resolve(target)
        self._inject_fault(rt, verb, target)
        params, api, sub = request.query, self.api, target.subresource
        raw = await request.read()
        namespace = target.namespace if rt.namespaced else None
        dry_run = bool(params.get("dryRun"))
        content_type = (request.headers.get("Content-Type") or "application/json").split(";")[0].strip()
        manager = managed.manager_of(params.get("fieldManager"), request.headers.get("User-Agent"))
        table_include = (params.get("includeObject") or "PartialObjectMetadata") \
            if tables.wants_table(request.headers.get("Accept")) and sub is None else None
        if verb in ("list", "watch", "deletecollection"):
            return await self._serve_collection(request, rt, namespace, target.name, verb, table_include)
        if verb == "create" and target.name is None and sub is None:
            created = api.create(rt, namespace, decode_body(raw, content_type), dry_run=dry_run,
                                 manager=manager)
            return json_response(present(rt, created), 201)
        if target.name is None or verb not in ("get", "update", "patch", "delete"):
            raise errors.method_not_allowed(verb)
        name = target.name
        if sub == "scale":
            if verb == "get":
                return json_response(api.get_scale(rt, namespace, name))
            if verb in ("update", "patch"):
                return json_response(api.write_scale(rt, namespace, name, content_type if verb == "patch" else None,
                                                     raw, dry_run=dry_run, manager=manager))
            raise errors.method_not_allowed(verb)
        if verb == "get":
            obj = present(rt, api.current(rt, namespace, name))
            if table_include is not None:
                return json_response(tables.table(rt, [obj], obj["metadata"]["resourceVersion"], table_include))
            return json_response(obj)
        if verb == "update":
            obj = api.update(rt, namespace, name, decode_body(raw, content_type), subresource=sub,
                             dry_run=dry_run, manager=manager)
        elif verb == "patch":
            obj = api.patch(rt, namespace, name, content_type, raw, subresource=sub, dry_run=dry_run,
                            manager=manager)
        elif sub is None:
            obj = api.delete(rt, namespace, name, decode_body(raw, content_type), dry_run=dry_run)
        else:
            raise errors.method_not_allowed(verb)
        return json_response(present(rt, obj))

    async def _serve_collection(self, request: web.BaseRequest, rt: ResourceType, namespace: str | None,
                                name: str | None, verb: str, table_include: str | None) -> web.StreamResponse:
        params = request.query
        by_label = selectors.label_selector(params.get("labelSelector"))
        by_field = selectors.field_selector(params.get("fieldSelector"))
        name = name or selectors.selected_name(params.get("fieldSelector"))

        def matches(obj: dict[str, Any]) -> bool:
            meta = obj["metadata"]
            return ((namespace is None or meta.get("namespace") == namespace)
                    and (name is None or meta["name"] == name) and by_label(obj) and by_field(obj))

        since = _int_param(params, "resourceVersion")
        store = self.api.store
        if verb == "watch":
            timeout = _int_param(params, "timeoutSeconds")
            options = WatchOptions(
                since=since or None,  # "0" means "any version": start from the current objects
                matches=matches, timeout=float(timeout) if timeout else self.watch_timeout,
                bookmarks=params.get("allowWatchBookmarks") in ("1", "true", "True"),
                bookmark_interval=self.bookmark_interval, table_include=table_include)
            return await serve_watch(request, store, rt, options)
        if verb == "deletecollection":
            dry_run = bool(params.get("dryRun"))
            gone = [present(rt, self.api.delete(rt, obj["metadata"].get("namespace"), obj["metadata"]["name"],
                                                dry_run=dry_run))
                    for obj in store.items(rt, namespace) if matches(obj)]
            return json_response({"kind": f"{rt.kind}List", "apiVersion": rt.api_version,
                                  "metadata": {"resourceVersion": str(store.resource_version)}, "items": gone})
        if since and params.get("resourceVersionMatch") == "Exact" and since < store.oldest_resumable:
            raise errors.gone(since, store.oldest_resumable)
        rv = str(store.resource_version)
        items = [present(rt, obj) for obj in store.items(rt, namespace) if matches(obj)]
        if table_include is not None:
            return json_response(tables.table(rt, items, rv, table_include))
        return json_response({"kind": f"{rt.kind}List", "apiVersion": rt.api_version,
                              "metadata": {"resourceVersion": rv}, "items": items})

    async def _serve_debug(self, request: web.BaseRequest, action: str) -> web.StreamResponse:
        method = request.method
        try:
            body = json.loads(await request.read() or b"{}")
        except ValueError:
            body = None
        body = body if isinstance(body, dict) else {}
        store = self.api.store
        if (method, action) == ("GET", "requests"):
            user = request.query.get("user")
            if user is not None:  # one client's requests (its kubeconfig token `<user>-token`)
                return json_response([{**entry._asdict(), **({"body": body} if body else {})}
                                      for who, entry, body in self.callers if who == user])
            return json_response([entry._asdict() for entry in self.record])
        if (method, action) == ("POST", "reset-record"):
            self.record.clear()
            self.callers.clear()
            return json_response({"requests": 0})
        if (method, action) == ("POST", "compact"):
            expire = request.query.get("expireWatches", "true") not in ("0", "false", "False")
            return json_response({"oldestResumable": store.compact(expire_watches=expire)})
        faults = {"faults/conflict": (self.fail_writes, self.write_faults),
                  "faults/throttle": (self.throttle_writes, self.throttled)}
        if method == "POST" and action in faults:
            inject, remaining = faults[action]
            try:
                rt = self.find_type(str(body.get("resource", "")))
            except KeyError as exc:
                return json_response({"error": str(exc)}, 404)
            inject(rt, int(body.get("count", 1)))
            return json_response({"group": rt.group, "resource": rt.plural,
                                  "remaining": remaining[rt.storage_key]})
        if action == "unavailable" and method in ("GET", "POST"):
            if method == "POST":
                self.set_unavailable(bool(body.get("on", True)))
            return json_response({"on": self.unavailable})
        return json_response({"error": f"unknown emulator endpoint: {method} {DEBUG_PREFIX}{action}"}, 404)
