"""Which pool holds a model name (platform/kube/claims.py): the oldest claim, in any namespace,
whatever order the pools are seen in."""

from __future__ import annotations

import itertools

from extproc.platform.kube._calls import custom_path, segment
from extproc.platform.kube.claims import NameClaims, claimed, holder, refusal
from extproc.policy.model import PoolKey, PoolSpec

A = PoolKey("team-a", "slot")
B = PoolKey("team-b", "slot")
C = PoolKey("team-c", "gpu")
EARLY, LATE = "2026-01-01T10:00:00Z", "2026-01-02T09:00:00Z"


def test_the_oldest_pool_holds_then_namespace_then_name() -> None:
    assert holder({B: EARLY, A: LATE}) == B
    assert holder({B: EARLY, A: EARLY}) == A  # same second: team-a before team-b
    assert holder({PoolKey("ns", "z"): EARLY, PoolKey("ns", "b"): EARLY}) == PoolKey("ns", "b")
    assert holder({A: "", B: LATE}) == B  # an unknown creation time claims last


def test_a_later_claim_is_refused_whatever_order_the_pools_arrive_in() -> None:
    pools = {A: (EARLY, ("chat", "coder")), B: (LATE, ("other", "chat")),
             C: (LATE, ("coder", "gpu"))}
    for order in itertools.permutations(pools):
        claims = NameClaims()
        for key in order:
            claims.claim(key, *pools[key])
        assert claims.refused(A) == {}
        assert claims.refused(B) == {"chat": A}
        assert claims.refused(C) == {"coder": A}


def test_changes_report_the_other_pools_they_touch_and_a_freed_name_passes_on() -> None:
    claims = NameClaims()
    assert claims.claim(A, EARLY, ["chat"]) == set()
    assert claims.claim(B, LATE, ["chat", "other"]) == {A}
    assert claims.claim(C, LATE, ["gpu"]) == set()
    assert claims.refused(B) == {"chat": A}
    assert claims.claim(A, EARLY, ["chat", "gpu"]) == {B, C}  # A now claims gpu too
    assert claims.refused(C) == {"gpu": A}
    assert claims.drop(A) == {B, C}
    assert claims.refused(B) == {} and claims.refused(C) == {}
    assert claims.drop(A) == set()  # unknown: nothing to do


def test_the_refusal_names_the_holder() -> None:
    assert "ModelPool team-a/slot" in refusal("chat", A) and "chat" in refusal("chat", A)


def test_a_refused_name_is_unrouted_and_reported_the_rest_of_the_spec_kept() -> None:
    claims = NameClaims()
    claims.claim(A, EARLY, ["chat"])
    mine = PoolSpec(B, ("other",), aliases={"chat": "other"})
    claims.claim(B, LATE, ["other", "chat"])
    spec, problems = claimed(claims, mine, ("an earlier problem",))
    assert spec.unrouted == ("chat",) and spec.aliases == mine.aliases
    assert problems == ("an earlier problem", refusal("chat", A))
    assert claimed(claims, PoolSpec(A, ("chat",)), ()) == (PoolSpec(A, ("chat",)), ())


def test_every_path_segment_is_quoted() -> None:
    assert segment("../../x") == "..%2F..%2Fx"
    assert segment("..") == "%2E%2E" and segment(".") == "%2E"
    assert segment("a b?c#d") == "a%20b%3Fc%23d"
    assert custom_path("team-b", "inferenceservices", "../../../namespaces/team-a/x") == (
        "/apis/inference.llmkube.dev/v1alpha1/namespaces/team-b/inferenceservices/"
        "..%2F..%2F..%2Fnamespaces%2Fteam-a%2Fx")
    assert custom_path("ml", "modelpools", "slot", "status") == (
        "/apis/inference.llmkube.dev/v1alpha1/namespaces/ml/modelpools/slot/status")
