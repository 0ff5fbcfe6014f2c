"""Fixtures for the deploy tests: render kustomizations with `kubectl kustomize`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from kustomize import render_path  # noqa: E402


@pytest.fixture(scope="session")
def render() -> Callable[[str], list[dict[str, Any]]]:
    return render_path


@pytest.fixture(scope="session")
def render_with() -> Callable[..., list[dict[str, Any]]]:
    return lambda path, components=(): render_path(path, tuple(components))
