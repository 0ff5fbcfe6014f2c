"""rbac_covers / rbac_excess on hand-written records, then on the manifests' own rules."""

from __future__ import annotations

import pytest

from k8s_schema import builtin_errors
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


# The calls the service makes (the end-to-end suite's record agrees: no get on the pools' kinds,
# the watch cache answers every read, a re-read after a 409 is a list by name): the manifests
# must grant exactly these.
POOL_CALLS = [
    ("list", "inference.llmkube.dev", "modelpools", "", "llm", ""),
    ("watch", "inference.llmkube.dev", "modelpools", "", "llm", ""),
    ("patch", "inference.llmkube.dev", "modelpools", "", "llm", "shared-gpu"),  # leader stamp
    ("patch", "inference.llmkube.dev", "modelpools", "status", "llm", "shared-gpu"),
    ("list", "inference.llmkube.dev", "inferenceservices", "", "llm", ""),
    ("watch", "inference.llmkube.dev", "inferenceservices", "", "llm", ""),
    ("patch", "inference.llmkube.dev", "inferenceservices", "", "llm", "judge"),
    ("list", "", "pods", "", "llm", ""),
    ("watch", "", "pods", "", "llm", ""),
    ("list", "autoscaling", "horizontalpodautoscalers", "", "llm", ""),
    ("watch", "autoscaling", "horizontalpodautoscalers", "", "llm", ""),
    ("list", "keda.sh", "scaledobjects", "", "llm", ""),
    ("watch", "keda.sh", "scaledobjects", "", "llm", ""),
    ("create", "", "events", "", "llm", ""),
]
# The Lease client's calls (extproc/platform/kube/leases.py), all in the service's own
# namespace: GET one, LIST + WATCH the membership Leases by label, POST, PUT with the
# resourceVersion read (renew, takeover, release), DELETE with a precondition (a clean leave).
MEMBER_LEASE = "modelpool-extproc-modelpool-extproc-7d9f8b6c5d-x2k4p"
LEADER_LEASE = "modelpool-extproc-leader"  # one for the replica set
LEASE_CALLS = [
    ("get", "coordination.k8s.io", "leases", "", "llm", LEADER_LEASE),
    ("list", "coordination.k8s.io", "leases", "", "llm", ""),
    ("watch", "coordination.k8s.io", "leases", "", "llm", ""),
    ("create", "coordination.k8s.io", "leases", "", "llm", ""),
    ("update", "coordination.k8s.io", "leases", "", "llm", MEMBER_LEASE),
    ("update", "coordination.k8s.io", "leases", "", "llm", LEADER_LEASE),
    ("delete", "coordination.k8s.io", "leases", "", "llm", MEMBER_LEASE),
]
SERVICE_CALLS = POOL_CALLS + LEASE_CALLS
LEASE_ROLE = "modelpool-extproc-leases"


def _roles(objs: list[dict]) -> list[dict]:
    return [o for o in objs if o["kind"] in ("Role", "ClusterRole")]


def _elsewhere(calls: list[tuple], namespace: str) -> list[tuple]:
    return [(v, g, r, s, namespace, n) for v, g, r, s, _, n in calls]


def _check_lease_role(objs: list[dict]) -> None:
    """The Leases' own Role in `llm`: the Lease calls there, nothing else, nowhere else."""
    (lease_role,) = [r for r in _roles(objs) if r["metadata"]["name"] == LEASE_ROLE]
    assert lease_role["kind"] == "Role" and lease_role["metadata"]["namespace"] == "llm"
    assert rbac_covers([lease_role], LEASE_CALLS) == []
    assert rbac_excess([lease_role], LEASE_CALLS) == []
    # Leases in another namespace, or across all namespaces, are not granted by any Role
    roles = _roles(objs)
    assert len(rbac_covers(roles, _elsewhere(LEASE_CALLS, "other"))) == len(LEASE_CALLS)
    assert len(rbac_covers(roles, _elsewhere(LEASE_CALLS, ""))) == len(LEASE_CALLS)
    # ... and the pools' Role or ClusterRole grants no Lease call
    pools = [r for r in roles if r is not lease_role]
    assert len(rbac_covers(pools, LEASE_CALLS)) == len(LEASE_CALLS)


def _check_bindings(objs: list[dict]) -> None:
    """Every Role and ClusterRole is bound to the Deployment's ServiceAccount, and only to it."""
    dep = next(o for o in objs if o["kind"] == "Deployment"
               and o["metadata"]["name"] == "modelpool-extproc")
    account = {"kind": "ServiceAccount", "name": dep["spec"]["template"]["spec"][
        "serviceAccountName"], "namespace": dep["metadata"]["namespace"]}
    bound = {}
    for binding in (o for o in objs if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        assert binding["subjects"] == [account], binding["metadata"]["name"]
        ref = binding["roleRef"]
        scope = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        bound[(ref["kind"], ref["name"], scope)] = binding["kind"]
    assert set(bound) == {(r["kind"], r["metadata"]["name"], r["metadata"].get("namespace"))
                          for r in _roles(objs)}


@pytest.mark.parametrize("overlay", ["envoy-gateway", "standalone-envoy"])
def test_base_role_grants_exactly_the_service_calls(render, overlay: str) -> None:
    objs = render(f"deploy/overlays/{overlay}")
    roles = _roles(objs)
    assert sorted((r["kind"], r["metadata"]["name"]) for r in roles) == [
        ("Role", "modelpool-extproc"), ("Role", LEASE_ROLE)]
    assert rbac_covers(roles, SERVICE_CALLS) == []
    assert rbac_excess(roles, SERVICE_CALLS) == []
    # namespaced: a cluster-wide watch is not allowed
    assert rbac_covers(roles, [("watch", "inference.llmkube.dev", "modelpools", "", "", "")])
    _check_lease_role(objs)
    _check_bindings(objs)


def test_cluster_wide_component_grants_exactly_the_service_calls(render_with) -> None:
    objs = render_with("deploy/base", components=["deploy/components/cluster-wide"])
    roles = _roles(objs)
    # the pools' Role becomes a ClusterRole; the Leases keep their Role in the service's namespace
    assert sorted((r["kind"], r["metadata"]["name"]) for r in roles) == [
        ("ClusterRole", "modelpool-extproc"), ("Role", LEASE_ROLE)]
    everywhere = SERVICE_CALLS + [(v, g, r, s, "", n) for v, g, r, s, _, n in POOL_CALLS
                                  if v in ("list", "watch")]
    assert rbac_covers(roles, everywhere) == []
    assert rbac_excess(roles, SERVICE_CALLS) == []
    _check_lease_role(objs)
    _check_bindings(objs)


def _flow_schema_calls(schema: dict) -> tuple[dict, list[tuple]]:
    """The one subject of ``schema`` and the requests its resource rules match, as records
    (the namespaced rule expanded over its verbs; a FlowSchema's resourceRules read like RBAC)."""
    (rule,) = schema["spec"]["rules"]
    (subject,) = rule["subjects"]
    (resource_rule,) = rule["resourceRules"]
    assert "nonResourceRules" not in rule and "clusterScope" not in resource_rule
    calls = [(verb, group, resource, "", namespace, "")
             for verb in resource_rule["verbs"] for group in resource_rule["apiGroups"]
             for resource in resource_rule["resources"] for namespace in resource_rule["namespaces"]]
    return subject, calls


def test_flowschema_component_puts_exactly_the_lease_calls_in_leader_election(render_with) -> None:
    objs = render_with("deploy/base", components=["deploy/components/flowschema"])
    (schema,) = [o for o in objs if o["kind"] == "FlowSchema"]
    assert schema["apiVersion"] == "flowcontrol.apiserver.k8s.io/v1"
    assert builtin_errors(schema) == []
    spec = schema["spec"]
    assert spec["priorityLevelConfiguration"] == {"name": "leader-election"}
    # ahead of the suggested `service-accounts` schema (9000), which matches every ServiceAccount
    assert 0 < spec["matchingPrecedence"] < 9000
    assert spec["distinguisherMethod"] == {"type": "ByUser"}
    subject, calls = _flow_schema_calls(schema)
    dep = next(o for o in objs if o["kind"] == "Deployment")
    assert subject == {"kind": "ServiceAccount", "serviceAccount": {
        "name": dep["spec"]["template"]["spec"]["serviceAccountName"],
        "namespace": dep["metadata"]["namespace"]}}
    # the very calls the Leases' Role grants: every verb of it, in its namespace, nothing more
    (lease_role,) = [r for r in _roles(objs) if r["metadata"]["name"] == LEASE_ROLE]
    assert rbac_covers([lease_role], calls) == []
    assert rbac_excess([lease_role], calls) == []
    assert {c[:3] for c in calls} == {c[:3] for c in LEASE_CALLS}
    # the component changes nothing else
    assert [o for o in objs if o is not schema] == render_with("deploy/base")
