"""The ModelPool CRD follows LLMKube's newer API (swapPolicy reclaim, spec.reclaimAfter,
status.residentIdleSince) and still accepts every object the seed schema accepted.

The oracle is LLMKube's own CRD (``k8s_schema.LLMKUBE`` says where it comes from; the tests
skip, saying so, when it is missing),
as is, and with the newer releases' delta applied (``newer_llmkube_schema``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from devstack.stack_demo import POOL_PATCHES
from k8s_schema import LLMKUBE, LLMKUBE_MISSING, OUR_CRDS, apply_defaults, errors
from modelpool_samples import (INVALID, NEWER_INVALID, NEWER_VALID, VALID, newer_llmkube_schema,
                               pool)

OURS = OUR_CRDS / "inference.llmkube.dev_modelpools.yaml"
SEED = LLMKUBE / "inference.llmkube.dev_modelpools.yaml"
EVERY_SAMPLE = {**VALID, **INVALID, **NEWER_VALID, **NEWER_INVALID}


def _schema(path: Path) -> dict[str, Any]:
    if not path.exists():
        pytest.skip(f"{path} is missing: {LLMKUBE_MISSING}")
    return yaml.safe_load(path.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("name", sorted(NEWER_VALID))
def test_newer_samples_accepted(name: str) -> None:
    obj = NEWER_VALID[name]
    seed = _schema(SEED)
    assert errors(seed, obj, strict=True), "the seed schema accepts it: not a newer-API sample"
    assert errors(_schema(OURS), obj, strict=True) == []
    assert errors(newer_llmkube_schema(seed), obj, strict=True) == []


@pytest.mark.parametrize("name", sorted(NEWER_INVALID))
def test_newer_negatives_rejected(name: str) -> None:
    obj = NEWER_INVALID[name]
    newer = newer_llmkube_schema(_schema(SEED))
    assert errors(newer, obj, strict=True), "the newer oracle accepts it: not a real negative"
    assert errors(_schema(OURS), obj, strict=True), f"our CRD accepts {name!r}"


@pytest.mark.parametrize("strict", [False, True], ids=["pruning", "strict"])
def test_verdicts_match_the_newer_llmkube_schema(strict: bool) -> None:
    ours = _schema(OURS)
    newer = newer_llmkube_schema(_schema(SEED))
    differ = [name for name, obj in sorted(EVERY_SAMPLE.items())
              if bool(errors(ours, obj, strict)) != bool(errors(newer, obj, strict))]
    assert differ == []
    # the corpus has both verdicts in both modes, so the comparison can tell them apart
    verdicts = {bool(errors(ours, obj, strict)) for obj in EVERY_SAMPLE.values()}
    assert verdicts == {True, False}


def test_everything_the_seed_schema_accepts_stays_valid() -> None:
    seed, ours = _schema(SEED), _schema(OURS)
    accepted = [name for name, obj in EVERY_SAMPLE.items() if not errors(seed, obj, strict=True)]
    assert set(VALID) <= set(accepted)
    assert [name for name in sorted(accepted) if errors(ours, EVERY_SAMPLE[name], strict=True)] == []


def test_only_bad_values_of_the_new_fields_lose_their_silent_pruning() -> None:
    # Under the seed schema an API server prunes fields it does not know, so a malformed
    # reclaimAfter or residentIdleSince was dropped silently; now it is refused, exactly as
    # by LLMKube's newer CRD. Nothing else the seed accepted is refused.
    seed, ours = _schema(SEED), _schema(OURS)
    newer = newer_llmkube_schema(seed)
    refused_now = sorted(name for name, obj in EVERY_SAMPLE.items()
                         if not errors(seed, obj) and errors(ours, obj))
    new_fields = ("reclaimAfter", "residentIdleSince", "swapDelay", "schedulerName")
    assert refused_now == sorted(name for name in NEWER_INVALID
                                 if any(field in name for field in new_fields))
    assert all(errors(newer, EVERY_SAMPLE[name]) for name in refused_now)


def test_reclaim_after_defaults_like_llmkube() -> None:
    newer = newer_llmkube_schema(_schema(SEED))
    for obj in (pool(), pool(swapPolicy="reclaim", default="judge")):
        ours = apply_defaults(_schema(OURS), obj)["spec"]
        assert ours["reclaimAfter"] == apply_defaults(newer, obj)["spec"]["reclaimAfter"]
        assert ours["reclaimAfter"] == "300s"
    kept = apply_defaults(_schema(OURS), pool(reclaimAfter="10m"))["spec"]
    assert kept["reclaimAfter"] == "10m" and kept["swapPolicy"] == "sticky"


@pytest.mark.parametrize("patch", [patch for patch, _ in POOL_PATCHES])
def test_the_pool_patches_the_demo_prints_are_valid(patch: str) -> None:
    assert errors(_schema(OURS), pool(**json.loads(patch)["spec"]), strict=True) == []
