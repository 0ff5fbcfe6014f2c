"""Fixtures for the kube_real tests: one real etcd + kube-apiserver per session, our CRDs in.

A kube_real test that is skipped says why (the binaries are not built, ../shared is missing).
Under CI=true a skipped kube_real test fails the run: CI builds the binaries, so a skip there
means the real-server checks silently did not happen.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
# Shared with other test folders: the ModelPool corpus and the RBAC coverage helpers
# (tests/deploy), the running-watcher and polling helpers (tests/platform).
sys.path.insert(0, str(Path(__file__).parents[1] / "deploy"))
sys.path.insert(0, str(Path(__file__).parents[1] / "platform"))

from control_plane import ControlPlane, binaries, install_our_crds  # noqa: E402

_SKIPPED: list[str] = []
_NAMESPACE_SERIAL = itertools.count()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Remember every kube_real test that was skipped (CI turns them into a failure)."""
    if report.skipped and "kube_real" in report.keywords:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        _SKIPPED.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under CI=true, fail the session when any kube_real test was skipped."""
    if _SKIPPED and os.environ.get("CI") == "true":
        sys.stderr.write("\nkube_real tests were skipped under CI=true (they must run):\n"
                         + "".join(f"  {line}\n" for line in _SKIPPED))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def need_binaries() -> None:
    """Skip, saying why, when etcd or kube-apiserver is not built."""
    try:
        binaries()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The session's real API server (admin kubeconfig at ``.kubeconfig``), our CRDs installed."""
    need_binaries()
    plane = ControlPlane(tmp_path_factory.mktemp("kube-real")).start()
    try:
        install_our_crds(plane)
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def namespace(control_plane: ControlPlane, request: pytest.FixtureRequest) -> str:
    """A fresh namespace for one test (never deleted: no controller would finalize it)."""
    slug = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40]
    name = f"t{next(_NAMESPACE_SERIAL)}-{slug.strip('-')}"
    control_plane.ensure_namespace(name)
    return name
