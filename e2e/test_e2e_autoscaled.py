"""An autoscaler aimed at a pool member, end to end in both actuation modes: the member is
refused (its requests answered 503 member_autoscaled naming the autoscaler, MembersValid False),
the rest of the pool serves on, and deleting the autoscaler serves the member again. Own mode
meets a KEDA ScaledObject (the local stack has its CRD), llmkube mode an HPA, which LLMKube's
stand-in refuses too."""

from __future__ import annotations

import json

import aiohttp
import pytest
import yaml

from e2e_support import (NAMESPACE, chat, condition, eventually, notices, pools, start_stack,
                          wait_resident)


def _autoscaler(kind: str, name: str, member: str) -> dict:
    if kind == "ScaledObject":
        head = {"apiVersion": "keda.sh/v1alpha1", "kind": kind}
        spec = {"scaleTargetRef": {"apiVersion": "inference.llmkube.dev/v1alpha1",
                                   "kind": "InferenceService", "name": member},
                "triggers": [{"type": "cpu", "metadata": {"value": "50"}}]}
    else:
        head = {"apiVersion": "autoscaling/v2", "kind": kind}
        spec = {"scaleTargetRef": {"apiVersion": "inference.llmkube.dev/v1alpha1",
                                   "kind": "InferenceService", "name": member},
                "minReplicas": 1, "maxReplicas": 2}
    return {**head, "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


@pytest.mark.parametrize("actuation,kind,refused_reason", [
    ("own", "ScaledObject", "MemberAutoscaled"),
    ("llmkube", "HorizontalPodAutoscaler", "AutoscaledMembers")])
async def test_an_autoscaled_member_is_refused_and_restored(
        tmp_path_factory, http: aiohttp.ClientSession, actuation: str, kind: str,
        refused_reason: str) -> None:
    pool = f"as-{actuation}"
    a, b = f"{pool}-a", f"{pool}-b"
    stack = start_stack(tmp_path_factory.mktemp(pool), pools((pool, [a, b], {"default": a})),
                        actuation=actuation)
    try:
        await wait_resident(stack, pool, a, timeout=30)
        stack.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(_autoscaler(kind, "scaler", b)))
        await eventually(lambda: condition(stack, pool, "MembersValid").get("reason")
                         == refused_reason, 20, "MembersValid naming the autoscaled member")
        assert b in condition(stack, pool, "MembersValid")["message"]
        reply = await chat(http, stack, b)
        assert reply.status == 503, reply.body
        error = json.loads(reply.body)["error"]
        assert error["code"] == "member_autoscaled" and f"{kind}/scaler" in error["message"]
        served = await chat(http, stack, a)
        assert (served.status, served.served_by) == (200, a), served.body
        assert notices(stack, pool, "MemberAutoscaled") or actuation == "llmkube"
        stack.kubectl("delete", kind.lower() if kind == "ScaledObject" else "hpa", "scaler",
                      "-n", NAMESPACE)
        await eventually(lambda: condition(stack, pool, "MembersValid").get("status") == "True",
                         20, "the member valid again")
        reply = await chat(http, stack, b)
        assert (reply.status, reply.served_by) == (200, b), reply.body
    finally:
        stack.stop()
