"""What a notice leaves behind (runtime.notices.report): the conflict counter, per mode."""

from __future__ import annotations

from extproc import metrics
from extproc.policy.events import Notice
from extproc.policy.model import Actuation, PoolKey
from extproc.runtime.notices import report


def conflicts(pool: str, manager: str) -> float:
    return metrics.REGISTRY.get_sample_value(
        "modelpool_extproc_conflicts_total",
        {"namespace": "ns", "pool": pool, "manager": manager}) or 0.0


def test_a_replicas_write_is_a_conflict_in_llmkube_mode_only() -> None:
    written = Notice("ReplicasWritten", "b's spec.replicas was set to 1", source="b",
                     writer="kubectl")
    assert report(written, PoolKey("ns", "notices-llmkube"), Actuation.LLMKUBE, "a")
    assert conflicts("notices-llmkube", "kubectl") == 1
    # own mode undoes a person's write and counts only the hand-off of a fight
    assert report(written, PoolKey("ns", "notices-own"), Actuation.OWN, "a")
    assert conflicts("notices-own", "kubectl") == 0
