"""rbac_covers / rbac_excess on hand-written records, then on the manifests' own rules."""

from __future__ import annotations

import pytest

from rbac import Request, as_request, rbac_covers, rbac_excess

RULES = [
    {"apiGroups": ["inference.llmkube.dev"], "resources": ["modelpools"],
     "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["inference.llmkube.dev"], "resources": ["modelpools/status"],
     "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"],
     "resourceNames": ["settings"]},
]


def test_record_forms_are_equivalent() -> None:
    as_tuple = ("patch", "inference.llmkube.dev", "modelpools", "status", "llm", "shared-gpu")
    as_dict = {"verb": "patch", "apiGroup": "inference.llmkube.dev", "resource": "modelpools",
               "subresource": "status", "namespace": "llm", "name": "shared-gpu"}
    assert as_request(as_tuple) == as_request(as_dict) == Request(*as_tuple)
    assert as_request(("list", "", "pods")) == Request("list", "", "pods", "", "", "")
    assert as_request({"verb": "list", "group": None, "resource": "pods",
                       "subresource": None}) == Request("list", "", "pods")


def test_covered_record() -> None:
    record = [("watch", "inference.llmkube.dev", "modelpools", "", "llm", ""),
              ("patch", "inference.llmkube.dev", "modelpools", "status", "llm", "shared-gpu"),
              ("list", "", "pods", None, "llm", None),
              ("get", "", "configmaps", "", "llm", "settings")]
    assert rbac_covers(RULES, record) == []


def test_missing_requests_are_reported_once() -> None:
    record = [("patch", "inference.llmkube.dev", "modelpools", "", "llm", "shared-gpu"),
              ("patch", "inference.llmkube.dev", "modelpools", "", "llm", "shared-gpu"),
              ("patch", "inference.llmkube.dev", "inferenceservices", "scale", "llm", "judge"),
              ("get", "", "configmaps", "", "llm", "other"),
              ("list", "", "configmaps", "", "llm", ""),
              ("create", "", "events", "", "llm", "")]
    missing = rbac_covers(RULES, record)
    # status patch does not grant a spec patch; scale is its own subresource; resourceNames
    # never grant other names or list
    assert [str(m) for m in missing] == [
        "patch inference.llmkube.dev/modelpools in llm",
        "patch inference.llmkube.dev/inferenceservices/scale in llm",
        "get core/configmaps in llm",
        "list core/configmaps in llm",
        "create core/events in llm",
    ]


def test_role_is_scoped_to_its_namespace() -> None:
    role = {"kind": "Role", "metadata": {"name": "r", "namespace": "llm"}, "rules": RULES[:1]}
    assert rbac_covers([role], [("list", "inference.llmkube.dev", "modelpools", "", "llm", "")]) == []
    # another namespace, and an all-namespaces list, need a ClusterRole
    assert len(rbac_covers([role], [("list", "inference.llmkube.dev", "modelpools", "", "other", ""),
                                    ("list", "inference.llmkube.dev", "modelpools", "", "", "")])) == 2
    cluster = dict(role, kind="ClusterRole")
    assert rbac_covers([cluster], [("list", "inference.llmkube.dev", "modelpools", "", "", "")]) == []


def test_wildcards() -> None:
    rules = [{"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["*"]}]
    assert rbac_covers(rules, [("patch", "x.io", "things", "status", "", "")]) == []
    assert rbac_covers(rules, [("patch", "x.io", "things", "", "", "")]) != []
    assert rbac_excess(rules, []) == [("*", "*/status", "*")]


def test_excess_lists_unused_grants() -> None:
    record = [("get", "inference.llmkube.dev", "modelpools", "", "llm", "shared-gpu"),
              ("list", "", "pods", "", "llm", "")]
    assert rbac_excess(RULES, record) == [
        ("", "configmaps", "get"), ("", "pods", "watch"),
        ("inference.llmkube.dev", "modelpools", "list"),
        ("inference.llmkube.dev", "modelpools", "watch"),
        ("inference.llmkube.dev", "modelpools/status", "patch"),
    ]


# The calls the service makes (the end-to-end suite's record agrees: no get, the watch
# cache answers every read): the manifests must grant exactly these.
SERVICE_CALLS = [
    ("list", "inference.llmkube.dev", "modelpools", "", "llm", ""),
    ("watch", "inference.llmkube.dev", "modelpools", "", "llm", ""),
    ("patch", "inference.llmkube.dev", "modelpools", "status", "llm", "shared-gpu"),
    ("list", "inference.llmkube.dev", "inferenceservices", "", "llm", ""),
    ("watch", "inference.llmkube.dev", "inferenceservices", "", "llm", ""),
    ("patch", "inference.llmkube.dev", "inferenceservices", "", "llm", "judge"),
    ("list", "", "pods", "", "llm", ""),
    ("watch", "", "pods", "", "llm", ""),
    ("create", "", "events", "", "llm", ""),
]


@pytest.mark.parametrize("overlay", ["envoy-gateway", "standalone-envoy"])
def test_base_role_grants_exactly_the_service_calls(render, overlay: str) -> None:
    objs = render(f"deploy/overlays/{overlay}")
    roles = [o for o in objs if o["kind"] in ("Role", "ClusterRole")]
    assert [r["kind"] for r in roles] == ["Role"]
    assert rbac_covers(roles, SERVICE_CALLS) == []
    assert rbac_excess(roles, SERVICE_CALLS) == []
    # namespaced: a cluster-wide watch is not allowed
    assert rbac_covers(roles, [("watch", "inference.llmkube.dev", "modelpools", "", "", "")])


def test_cluster_wide_component_grants_exactly_the_service_calls(render_with) -> None:
    objs = render_with("deploy/base", components=["deploy/components/cluster-wide"])
    roles = [o for o in objs if o["kind"] in ("Role", "ClusterRole")]
    assert [r["kind"] for r in roles] == ["ClusterRole"]
    everywhere = SERVICE_CALLS + [(v, g, r, s, "", n) for v, g, r, s, _, n in SERVICE_CALLS
                                  if v in ("list", "watch")]
    assert rbac_covers(roles, everywhere) == []
    assert rbac_excess(roles, SERVICE_CALLS) == []
