"""Discovery and OpenAPI documents accurate enough for kubectl.

kmock's scaffold serves /api, /apis, /apis/<group> and /version from the declared resources;
these documents replace the two it cannot derive: the per-version resource list (subresources
need their own kinds and verbs, and no short names, or kubectl warns about ambiguity) and the
OpenAPI v3 index. kubectl reads the latter to learn that the server validates fields itself; an
index without our group-versions makes it fall back to client-side validation with protobuf
OpenAPI v2, which the emulator does not speak.
"""

from __future__ import annotations

from typing import Any

from devstack.kubeapi.resources import ResourceType

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
_SUB_VERBS = ["get", "patch", "update"]


def group_version(rt: ResourceType) -> str:
    """The URL prefix of a type's group-version, without the leading slash (`api/v1`, `apis/g/v`)."""
    return f"apis/{rt.group}/{rt.version}" if rt.group else f"api/{rt.version}"


def resource_list(api_version: str, types: list[ResourceType]) -> dict[str, Any]:
    """The APIResourceList of one group-version."""
    resources: list[dict[str, Any]] = []
    for rt in types:
        resources.append({"name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced,
                          "kind": rt.kind, "verbs": VERBS, "shortNames": list(rt.short_names),
                          "categories": list(rt.categories)})
        if rt.status:
            resources.append({"name": f"{rt.plural}/status", "singularName": "", "namespaced": rt.namespaced,
                              "kind": rt.kind, "verbs": _SUB_VERBS})
        if rt.scale:
            resources.append({"name": f"{rt.plural}/scale", "singularName": "", "namespaced": rt.namespaced,
                              "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": _SUB_VERBS})
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": api_version, "resources": resources}


def openapi_v3_index(types: list[ResourceType]) -> dict[str, Any]:
    """The /openapi/v3 index: one document per served group-version."""
    return {"paths": {gv: {"serverRelativeURL": f"/openapi/v3/{gv}"}
                      for gv in sorted({group_version(rt) for rt in types})}}


def openapi_v3_document(types: list[ResourceType]) -> dict[str, Any]:
    """A group-version's OpenAPI v3 document: just the PATCH operations with their fieldValidation parameter.

    PATCH operations carry no request-body content types, so kubectl apply builds merge patches
    (custom resources) or strategic ones from its compiled-in types (core kinds), as with CRDs.
    """
    paths = {}
    for rt in types:
        scope = "/namespaces/{namespace}" if rt.namespaced else ""
        gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        paths[f"/{group_version(rt)}{scope}/{rt.plural}/{{name}}"] = {"patch": {
            "x-kubernetes-group-version-kind": gvk,
            "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}],
            "responses": {"200": {"description": "OK"}},
        }}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.32.0"}, "paths": paths,
            "components": {"schemas": {}}}
