"""Who else writes a member's replicas, end to end. In both actuation modes a person's
``kubectl scale`` of an idle member is reported naming kubectl (a ReplicasWritten Warning, its
log line). Own mode undoes it, and Argo CD's server-side apply of the member's replicas hands
the pool off at once, the Event, the log line, the status and the metric naming it. llmkube
mode undoes nothing and never hands off: LLMKube's reconciler (the stand-in) acts on the write
(a swap to the member) and records its own Warning naming kubectl, and the conflict is counted
under manager kubectl."""

from __future__ import annotations

import json

import aiohttp
import pytest
import yaml

from devstack.reconciler import SCALED_OUTSIDE
from e2e_support import (NAMESPACE, chat, condition, eventually, extproc_calls, notices, pools,
                          start_stack, wait_resident)


@pytest.mark.parametrize("actuation", ["own", "llmkube"])
async def test_kubectl_is_reported_in_both_modes_and_argo_cd_hands_own_mode_off(
        tmp_path_factory, http: aiohttp.ClientSession, actuation: str) -> None:
    pool = f"writers-{actuation}"
    a, b = f"wr-{actuation}-a", f"wr-{actuation}-b"
    stack = start_stack(tmp_path_factory.mktemp(pool), pools((pool, [a, b], {"default": a})),
                        actuation=actuation)
    try:
        await wait_resident(stack, pool, a, timeout=30)
        # a person scales the idle member up: reported at once, naming kubectl
        stack.kubectl("scale", "isvc", b, "-n", NAMESPACE, "--replicas=1")
        await eventually(lambda: notices(stack, pool, "ReplicasWritten"), 20,
                         "the kubectl scale reported")
        [said] = notices(stack, pool, "ReplicasWritten")
        assert said["writer"] == "kubectl" and "'kubectl'" in said["msg"], said
        if actuation == "llmkube":
            await _llmkube_acts_on_it(stack, pool, b)
            return
        await eventually(lambda: stack.isvc(b)["spec"]["replicas"] == 0, 20,
                         f"{b} scaled back down")
        assert notices(stack, pool, "ActuationChanged") == []
        # Argo CD self-heals the member from Git: its manifest says replicas 1
        manifest = {"apiVersion": "inference.llmkube.dev/v1alpha1", "kind": "InferenceService",
                    "metadata": {"name": b, "namespace": NAMESPACE},
                    "spec": {"replicas": 1}}
        stack.kubectl("apply", "--server-side", "--force-conflicts",
                      "--field-manager=argocd-controller", "-f", "-",
                      stdin=yaml.safe_dump(manifest))
        await eventually(lambda: notices(stack, pool, "ActuationChanged"), 20,
                         "the pool handed off")
        [changed] = notices(stack, pool, "ActuationChanged")
        assert changed["target"] == "hands-off" and changed["writer"] == "argocd-controller"
        assert "ignoreDifferences" in changed["msg"]
        assert len(notices(stack, pool, "ReplicasWritten")) == 1  # no second report
        await eventually(lambda: condition(stack, pool, "Actuating").get("reason")
                         == "HandsOff", 20, "the status saying hands-off")
        assert "argocd-controller" in condition(stack, pool, "Actuating")["message"]
        assert stack.metric("modelpool_extproc_conflicts_total", pool=pool,
                            manager="argocd") == 1
        served = await chat(http, stack, a)  # routing goes on
        assert served.status == 200, served.body
        described = stack.kubectl("describe", "mpool", pool, "-n", NAMESPACE).stdout
        assert "argocd-controller" in described, described
    finally:
        stack.stop()


async def _llmkube_acts_on_it(stack, pool: str, member: str) -> None:
    """llmkube mode after a kubectl scale of ``member``: counted, never undone nor handed off;
    LLMKube's reconciler swaps to it and records its own Warning naming kubectl."""
    assert stack.metric("modelpool_extproc_conflicts_total", pool=pool, manager="kubectl") == 1
    await wait_resident(stack, pool, member, timeout=30)

    def warned() -> list[dict]:
        listed = json.loads(stack.kubectl("get", "events", "-n", NAMESPACE, "-o",
                                          "json").stdout)["items"]
        return [e for e in listed if e.get("reason") == SCALED_OUTSIDE
                and e["involvedObject"]["name"] == pool]

    [event] = await eventually(warned, 20, "the stand-in's Warning")
    assert event["type"] == "Warning" and '"kubectl"' in event["message"], event
    assert notices(stack, pool, "ActuationChanged") == []
    ours = [c for c in extproc_calls(stack) if c["verb"] in ("patch", "update")
            and c["resource"] == "inferenceservices" and c.get("name") == member]
    assert ours == [], ours  # no request asked for it: this service wrote nothing
