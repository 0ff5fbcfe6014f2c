"""Pure readers: ModelPool -> PoolSpec (defaults, bad values, aliases), pods -> member."""

from __future__ import annotations

from extproc.platform.kube.objects import (pod_member, pool_spec, service_capacity,
                                           service_state)
from extproc.policy.model import PoolKey
from extproc.settings import Settings

SETTINGS = Settings(swap_budget=120.0, fairness_window=15.0)


def pool(spec: dict, annotations: dict | None = None, generation: int = 4) -> dict:
    """A ModelPool object in namespace ml named slot."""
    return {"metadata": {"namespace": "ml", "name": "slot", "generation": generation,
                         "annotations": annotations or {}}, "spec": spec}


def members(*names: str) -> list[dict]:
    """spec.members entries for ``names``."""
    return [{"inferenceServiceRef": {"name": n}} for n in names]


def test_full_spec() -> None:
    spec, problems = pool_spec(pool(
        {"members": members("a", "b"), "default": "b", "swapBudget": "5m"},
        {"modelpool.inference.llmkube.dev/fairness-window": "45s",
         "modelpool.inference.llmkube.dev/aliases": "gpt=a, coder = b"}), SETTINGS)
    assert problems == ()
    assert spec.key == PoolKey("ml", "slot")
    assert spec.members == ("a", "b")
    assert spec.default == "b"
    assert spec.swap_budget == 300.0
    assert spec.fairness_window == 45.0
    assert spec.aliases == {"gpt": "a", "coder": "b"}
    assert spec.generation == 4


def test_defaults_come_from_settings() -> None:
    spec, problems = pool_spec(pool({"members": members("a")}), SETTINGS)
    assert problems == ()
    assert (spec.swap_budget, spec.fairness_window, spec.default, spec.aliases) == (
        120.0, 15.0, "", {})


def test_bad_values_fall_back_and_are_noted() -> None:
    spec, problems = pool_spec(pool(
        {"members": members("a", "a", ""), "default": "zz", "swapBudget": "soon"},
        {"modelpool.inference.llmkube.dev/fairness-window": "-3s",
         "modelpool.inference.llmkube.dev/aliases": "x=nobody,broken,y=a"}), SETTINGS)
    assert spec.members == ("a",)
    assert spec.default == ""
    assert spec.swap_budget == 120.0 and spec.fairness_window == 15.0
    assert spec.aliases == {"y": "a"}
    text = " | ".join(problems)
    for needle in ("listed twice", "empty", "spec.default zz", "'soon'", "fairness-window",
                   "nobody", "'broken'"):
        assert needle in text


def test_zero_budget_is_invalid_but_zero_fairness_is_pure_coalescing() -> None:
    spec, problems = pool_spec(pool({"members": members("a"), "swapBudget": "0s"},
                                    {"modelpool.inference.llmkube.dev/fairness-window": "0"}),
                               SETTINGS)
    assert spec.swap_budget == 120.0 and spec.fairness_window == 0.0
    assert len(problems) == 1 and "swapBudget" in problems[0]


def test_pod_member_prefers_service_label_then_app() -> None:
    both = {"metadata": {"labels": {"app": "x", "inference.llmkube.dev/service": "a"}}}
    app_only = {"metadata": {"labels": {"app": "b"}}}
    assert pod_member(both) == "a"
    assert pod_member(app_only) == "b"
    assert pod_member({"metadata": {}}) == ""


def test_terminating_pod_counts_finished_does_not() -> None:
    labels = {"inference.llmkube.dev/service": "a"}
    terminating = {"metadata": {"labels": labels, "deletionTimestamp": "2025-01-01T00:00:00Z"},
                   "status": {"phase": "Running"}}
    evicted = {"metadata": {"labels": labels}, "status": {"phase": "Failed"}}
    assert pod_member(terminating) == "a"
    assert pod_member(evicted) == ""


def test_service_state_defaults_replicas_to_one() -> None:
    assert service_state({"spec": {}}) == ("", 1)
    assert service_state({"spec": {"replicas": 0}, "status": {"phase": "Stopped"}}) == (
        "Stopped", 0)


def test_service_capacity_from_its_annotation() -> None:
    def isvc(value: str) -> dict:
        return {"metadata": {"annotations": {
            "modelpool.inference.llmkube.dev/capacity": value}}}
    assert service_capacity({}) == (0, "")
    assert service_capacity(isvc(" 4 ")) == (4, "")
    for bad in ("0", "-2", "four"):
        value, problem = service_capacity(isvc(bad))
        assert value == 0 and "is not a count" in problem and repr(bad) in problem


def test_reclaim_policy_and_reclaim_after_are_read() -> None:
    spec, problems = pool_spec(pool({"members": members("a", "b"), "default": "a",
                                     "swapPolicy": "reclaim", "reclaimAfter": "2m30s"}),
                               SETTINGS)
    assert problems == ()
    assert (spec.swap_policy, spec.reclaim_after) == ("reclaim", 150.0)


def test_swap_policy_and_reclaim_after_default_like_the_crd() -> None:
    # objects stored before the CRD had these defaults carry neither field
    spec, problems = pool_spec(pool({"members": members("a")}), SETTINGS)
    assert problems == ()
    assert (spec.swap_policy, spec.reclaim_after) == ("sticky", 300.0)


def test_unknown_swap_policy_is_kept_for_the_policy_to_report() -> None:
    # LLMKube's CRD on a cluster may already allow values this version does not implement
    spec, problems = pool_spec(pool({"members": members("a", "b"), "swapPolicy": "priority",
                                     "minResidency": "5m"}), SETTINGS)
    assert problems == ()
    assert spec.swap_policy == "priority"
    assert spec.members == ("a", "b")


def test_bad_reclaim_after_and_policy_type_fall_back_and_are_noted() -> None:
    for raw in ("soon", "0s", "-1m"):
        spec, problems = pool_spec(pool({"members": members("a"), "swapPolicy": "reclaim",
                                         "reclaimAfter": raw}), SETTINGS)
        assert spec.reclaim_after == 300.0 and spec.swap_policy == "reclaim"
        assert len(problems) == 1 and "spec.reclaimAfter" in problems[0] and repr(raw) in problems[0]
    spec, problems = pool_spec(pool({"members": members("a"), "swapPolicy": 3}), SETTINGS)
    assert spec.swap_policy == "sticky"
    assert len(problems) == 1 and "spec.swapPolicy 3" in problems[0]


def test_max_held_annotation_is_read_and_a_bad_one_falls_back_to_the_setting() -> None:
    annotation = "modelpool.inference.llmkube.dev/max-held"
    spec, problems = pool_spec(pool({"members": members("a")}, {annotation: "250"}), SETTINGS)
    assert (spec.max_held, problems) == (250, ())
    spec, _ = pool_spec(pool({"members": members("a")}), SETTINGS)
    assert spec.max_held is None  # the process's --max-held applies
    for raw in ("lots", "-3", "1.5"):
        spec, problems = pool_spec(pool({"members": members("a")}, {annotation: raw}), SETTINGS)
        assert spec.max_held is None
        assert len(problems) == 1 and annotation in problems[0] and repr(raw) in problems[0]


def test_activation_and_fallback_annotations_are_read_and_bad_ones_reported() -> None:
    activation = "modelpool.inference.llmkube.dev/activation"
    fallbacks = "modelpool.inference.llmkube.dev/fallbacks"
    obj = pool({"members": members("a", "b")},
               {activation: "if-idle", fallbacks: "a=a-small, b=b-cloud:443"})
    spec, problems = pool_spec(obj, SETTINGS)
    assert problems == () and spec.activation == "IfIdle"
    ns = spec.key.namespace
    assert spec.fallbacks == {"a": f"fallback.a-small.{ns}", "b": f"fallback.b-cloud.{ns}"}
    assert pool_spec(pool({"members": members("a")}), SETTINGS)[0].activation == "Wait"
    spec, problems = pool_spec(pool({"members": members("a")}, {
        activation: "eventually", fallbacks: "nobody=x,a=y:port,a"}), SETTINGS)
    assert spec.activation == "Wait" and spec.fallbacks == {}
    assert len(problems) == 4
    assert sum(fallbacks in p for p in problems) == 3
    assert sum(activation in p and "'eventually'" in p for p in problems) == 1


def test_min_residency_annotation_is_read_and_a_bad_one_is_off() -> None:
    annotation = "modelpool.inference.llmkube.dev/min-residency"
    spec, problems = pool_spec(pool({"members": members("a")}, {annotation: "4"}), SETTINGS)
    assert (spec.min_residency, problems) == (4, ())
    assert pool_spec(pool({"members": members("a")}), SETTINGS)[0].min_residency == 0
    spec, problems = pool_spec(pool({"members": members("a")}, {annotation: "many"}), SETTINGS)
    assert spec.min_residency == 0 and "0 (off)" in problems[0]


def test_priorities_annotation_is_read_and_bad_entries_reported() -> None:
    annotation = "modelpool.inference.llmkube.dev/priorities"
    spec, problems = pool_spec(pool({"members": members("a")},
                                    {annotation: "critical=10, batch=-5"}), SETTINGS)
    assert (spec.priorities, problems) == ({"critical": 10, "batch": -5}, ())
    spec, problems = pool_spec(pool({"members": members("a")},
                                    {annotation: "urgent=high,=3,x"}), SETTINGS)
    assert spec.priorities == {} and len(problems) == 3


def test_member_names_must_be_object_names_and_aliases_plain_names() -> None:
    """A member name goes into API paths: one that is no object name is refused, never used."""
    spec, problems = pool_spec(pool(
        {"members": members("a", "../../../namespaces/team-a/inferenceservices/victim",
                            "B", "b.v2", "x/y", "-a"), "default": "b.v2"},
        {"modelpool.inference.llmkube.dev/aliases":
         "meta-llama/Llama-3.1-8B=a, llama3:8b=a, ../x=a, two words=a, a..b=a, "
         "gpt-4o-mini@v1=b.v2"}), SETTINGS)
    assert spec.members == ("a", "b.v2")
    assert spec.default == "b.v2"
    assert spec.aliases == {"meta-llama/Llama-3.1-8B": "a", "llama3:8b": "a",
                            "gpt-4o-mini@v1": "b.v2"}
    refused = [p for p in problems if "not a valid object name" in p]
    assert len(refused) == 4 and "'../../../namespaces/team-a/inferenceservices/victim'" \
        in refused[0]
    assert sorted(p.split("'")[1] for p in problems if "not a plain model name" in p) == [
        "../x", "a..b", "two words"]


def test_field_owner_names_the_latest_manager_of_a_field() -> None:
    from extproc.platform.kube.objects import REPLICAS_FIELD, field_owner  # noqa: PLC0415
    replicas = {"f:spec": {"f:replicas": {}}}
    obj = {"metadata": {"managedFields": [
        {"manager": "kubectl-client-side-apply", "operation": "Update",
         "time": "2026-12-01T10:00:00Z", "fieldsType": "FieldsV1",
         "fieldsV1": {"f:spec": {"f:modelRef": {}}}},
        {"manager": "argocd-controller", "operation": "Apply", "time": "2026-12-01T10:00:05Z",
         "fieldsType": "FieldsV1", "fieldsV1": replicas},
        {"manager": "modelpool-extproc", "operation": "Apply", "time": "2026-12-01T10:00:01Z",
         "fieldsType": "FieldsV1", "fieldsV1": replicas}]}}
    assert field_owner(obj, REPLICAS_FIELD) == "argocd-controller"  # shared: the latest
    assert field_owner(obj, ("spec", "modelRef")) == "kubectl-client-side-apply"
    assert field_owner(obj, ("status", "phase")) == ""
    assert field_owner({"metadata": {"managedFields": "junk"}}, REPLICAS_FIELD) == ""


def test_swap_delay_and_scheduler_name_are_read() -> None:
    from extproc.platform.kube.objects import pool_spec  # noqa: PLC0415
    from extproc.settings import Settings  # noqa: PLC0415
    obj = {"metadata": {"name": "p", "namespace": "ns"},
           "spec": {"members": [{"inferenceServiceRef": {"name": "a"}}], "swapDelay": "1m30s",
                    "schedulerName": "gpu-binpack"}}
    spec, problems = pool_spec(obj, Settings())
    assert (spec.swap_delay, spec.scheduler_name, problems) == (90.0, "gpu-binpack", ())
    obj["spec"].update(swapDelay="soon", schedulerName={"x": 1})
    spec, problems = pool_spec(obj, Settings())
    assert (spec.swap_delay, spec.scheduler_name) == (0.0, "")
    assert len(problems) == 2 and "spec.swapDelay" in problems[0]
