"""Who else writes a member's replicas, end to end in own mode: a person's ``kubectl scale`` is
reported naming kubectl and undone; Argo CD's server-side apply of the member's replicas hands
the pool off at once, the Event, the log line, the status and the metric naming it."""

from __future__ import annotations

import aiohttp
import yaml

from e2e_support import (NAMESPACE, chat, condition, eventually, notices, pools, start_stack,
                          wait_resident)

MEMBERS = ["wr-a", "wr-b"]


async def test_kubectl_is_reported_and_argo_cd_hands_the_pool_off(
        tmp_path_factory, http: aiohttp.ClientSession) -> None:
    stack = start_stack(tmp_path_factory.mktemp("writers"),
                        pools(("writers", MEMBERS, {"default": "wr-a"})))
    try:
        await wait_resident(stack, "writers", "wr-a", timeout=30)
        # a person scales the idle member up: reported at once, and scaled back down
        stack.kubectl("scale", "isvc", "wr-b", "-n", NAMESPACE, "--replicas=1")
        await eventually(lambda: notices(stack, "writers", "ReplicasWritten"), 20,
                         "the kubectl scale reported")
        [said] = notices(stack, "writers", "ReplicasWritten")
        assert said["writer"] == "kubectl" and "'kubectl'" in said["msg"], said
        await eventually(lambda: stack.isvc("wr-b")["spec"]["replicas"] == 0, 20,
                         "wr-b scaled back down")
        assert notices(stack, "writers", "ActuationChanged") == []
        # Argo CD self-heals the member from Git: its manifest says replicas 1
        manifest = {"apiVersion": "inference.llmkube.dev/v1alpha1", "kind": "InferenceService",
                    "metadata": {"name": "wr-b", "namespace": NAMESPACE},
                    "spec": {"replicas": 1}}
        stack.kubectl("apply", "--server-side", "--force-conflicts",
                      "--field-manager=argocd-controller", "-f", "-",
                      stdin=yaml.safe_dump(manifest))
        await eventually(lambda: notices(stack, "writers", "ActuationChanged"), 20,
                         "the pool handed off")
        [changed] = notices(stack, "writers", "ActuationChanged")
        assert changed["target"] == "hands-off" and changed["writer"] == "argocd-controller"
        assert "ignoreDifferences" in changed["msg"]
        assert len(notices(stack, "writers", "ReplicasWritten")) == 1  # no second report
        await eventually(lambda: condition(stack, "writers", "Actuating").get("reason")
                         == "HandsOff", 20, "the status saying hands-off")
        assert "argocd-controller" in condition(stack, "writers", "Actuating")["message"]
        assert stack.metric("modelpool_extproc_conflicts_total", pool="writers",
                            manager="argocd") == 1
        served = await chat(http, stack, "wr-a")  # routing goes on
        assert served.status == 200, served.body
        described = stack.kubectl("describe", "mpool", "writers", "-n", NAMESPACE).stdout
        assert "argocd-controller" in described, described
    finally:
        stack.stop()
