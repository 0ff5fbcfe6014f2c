"""The emulator's pure pieces: patches, selectors, routes, printer helpers, schema defaults."""

from __future__ import annotations

import pytest

from devstack.kubeapi import errors, patches, routes, selectors, tables
from devstack.kubeapi.resources import apply_defaults


def test_merge_patch_follows_rfc_7386():
    target = {"a": "b", "c": {"d": "e", "f": "g"}, "list": [1, 2]}
    patch = {"a": "z", "c": {"f": None}, "list": [3], "new": {"x": None}}
    assert patches.merge_patch(target, patch) == {"a": "z", "c": {"d": "e"}, "list": [3], "new": {}}
    assert target["c"] == {"d": "e", "f": "g"}  # inputs untouched


def test_json_patch_operations_and_escapes():
    doc = {"a/b": 1, "m~n": 2, "list": ["x", "y"], "obj": {"k": "v"}}
    ops = [{"op": "replace", "path": "/a~1b", "value": 10},
           {"op": "remove", "path": "/m~0n"},
           {"op": "add", "path": "/list/1", "value": "between"},
           {"op": "move", "from": "/obj/k", "path": "/moved"},
           {"op": "copy", "from": "/list/0", "path": "/copied"},
           {"op": "test", "path": "/moved", "value": "v"}]
    assert patches.json_patch(doc, ops) == {"a/b": 10, "list": ["x", "between", "y"], "obj": {},
                                            "moved": "v", "copied": "x"}
    with pytest.raises(errors.ApiError) as failed:
        patches.json_patch(doc, [{"op": "test", "path": "/a~1b", "value": 2}])
    assert failed.value.code == 422
    with pytest.raises(errors.ApiError):
        patches.json_patch(doc, [{"op": "replace", "path": "/missing", "value": 1}])


@pytest.mark.parametrize(("selector", "expected"), [
    ("app=web", {"a"}), ("app==web,tier!=gpu", {"a"}), ("app in (web, db)", {"a", "b"}),
    ("app notin (web)", {"b", "c"}), ("tier", {"b"}), ("!tier", {"a", "c"}), ("", {"a", "b", "c"}),
])
def test_label_selectors(selector, expected):
    objs = {"a": {"app": "web"}, "b": {"app": "db", "tier": "gpu"}, "c": {}}
    matches = selectors.label_selector(selector)
    assert {name for name, labels in objs.items() if matches({"metadata": {"labels": labels}})} == expected


def test_field_selectors_and_pinned_names():
    pod = {"metadata": {"name": "p", "namespace": "ns"}, "status": {"phase": "Running"}}
    assert selectors.field_selector("metadata.name=p,status.phase!=Failed")(pod)
    assert not selectors.field_selector("spec.nodeName=n1")(pod)
    assert selectors.field_selector("spec.nodeName=")(pod)  # missing reads as empty
    assert selectors.selected_name("metadata.namespace=ns,metadata.name=p") == "p"
    with pytest.raises(errors.ApiError):
        selectors.field_selector("status.phase in (a)")


def test_routes_and_verbs():
    scale = routes.parse("/apis/g/v1/namespaces/ns/things/t/scale")
    assert scale == routes.Target("g", "v1", "things", "ns", "t", "scale")
    assert routes.parse("/api/v1/namespaces/ns") == routes.Target("", "v1", "namespaces", None, "ns")
    assert routes.parse("/api/v1/namespaces/ns/status").subresource == "status"
    assert routes.parse("/apis/g/v1") is None and routes.parse("/version") is None
    collection = routes.parse("/api/v1/pods")
    assert routes.verb("GET", collection, {"watch": "True"}) == "watch"  # the Python client's spelling
    assert routes.verb("GET", collection, {"watch": "1"}) == "watch"
    assert routes.verb("GET", routes.parse("/api/v1/watch/pods"), {}) == "watch"
    assert routes.verb("DELETE", collection, {}) == "deletecollection"
    assert routes.verb("PATCH", scale, {}) == "patch"


@pytest.mark.parametrize(("seconds", "text"), [
    (5, "5s"), (119, "119s"), (125, "2m5s"), (600, "10m"), (3 * 3600 + 60, "3h1m"), (30 * 3600, "30h"),
    (3 * 86400 + 3600, "3d1h"), (40 * 86400, "40d"), (800 * 86400, "2y70d"),
])
def test_human_durations_match_kubectl(seconds, text):
    assert tables.human_duration(seconds) == text


def test_json_path_and_schema_defaults():
    obj = {"status": {"members": [{"name": "a"}], "x.y": 1}}
    assert tables.json_path(obj, ".status.members[0].name") == "a"
    assert tables.json_path(obj, "{.status['x.y']}") == 1
    assert tables.json_path(obj, ".status.missing.deeper") is None
    schema = {"properties": {"spec": {"type": "object", "properties": {
        "default": {"type": "string"},  # a field named "default", not a default value
        "budget": {"type": "string", "default": "300s"},
        "items": {"type": "array", "items": {"properties": {"w": {"default": 1}}}}}}}}
    spec = {"spec": {"items": [{}, {"w": 5}]}}
    apply_defaults(schema, spec)
    assert spec == {"spec": {"budget": "300s", "items": [{"w": 1}, {"w": 5}]}}


def test_schema_defaults_reach_map_values_but_not_declared_fields_twice():
    schema = {"properties": {"tags": {"type": "object", "properties": {"fixed": {
        "properties": {"kind": {"default": "fixed"}}}},
        "additionalProperties": {"properties": {"kind": {"default": "literal"}}}}}}
    obj = {"tags": {"fixed": {}, "env": {}, "user": {"kind": "header"}}}
    apply_defaults(schema, obj)
    assert obj == {"tags": {"fixed": {"kind": "fixed"}, "env": {"kind": "literal"},
                            "user": {"kind": "header"}}}
