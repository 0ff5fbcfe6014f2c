"""Lease names made from the membership template are always names the API server accepts (a
DNS-1123 subdomain of at most 253 characters), the same for every replica, and unchanged when
the template's result was valid already (so replicas of two releases share their Leases). The
one leader Lease's name is a setting, refused at start when it is no valid name."""

from __future__ import annotations

import re

from hypothesis import given, settings, strategies as st

from extproc.platform.kube.leases import lease_name
from extproc.platform.kube.membership import Membership
from extproc.settings import Settings

SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LONG_POOL = ".".join(["p" * 62] * 4) + ".x"  # a valid 253-character ModelPool name


def valid(name: str) -> bool:
    """What the API server checks of a Lease's name."""
    return len(name) <= 253 and SUBDOMAIN.fullmatch(name) is not None


def test_the_membership_lease_of_a_long_identity_is_valid() -> None:
    member = Membership(None, "ml", "r" * 253, lambda: None, Settings())  # type: ignore[arg-type]
    assert valid(member.name) and member.name.startswith("modelpool-extproc-rrr")


def test_valid_names_are_kept_and_made_names_are_stable() -> None:
    assert lease_name("modelpool-extproc-leader.ml.gpu") == "modelpool-extproc-leader.ml.gpu"
    made = lease_name("modelpool-extproc-leader.ml." + LONG_POOL)
    assert made == lease_name("modelpool-extproc-leader.ml." + LONG_POOL)
    assert len(made) == 253 and re.fullmatch(r".*-[0-9a-f]{10}", made)
    # names that differ only past the cut stay apart
    assert made != lease_name("modelpool-extproc-leader.ml." + LONG_POOL[:-1] + "y")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_any_template_result_becomes_a_valid_name(wanted: str) -> None:
    name = lease_name(wanted)
    assert valid(name)
    assert lease_name(wanted) == name
    if valid(wanted):
        assert name == wanted
