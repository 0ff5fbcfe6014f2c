"""Binaries the deploy tests run, found where the Makefile builds them (or via the env)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from k8s_schema import PROJECT_ROOT


def tool_binary(env_var: str, default: str, how_to_get: str) -> Path:
    """``$env_var`` or ``default`` (relative to the project); skips saying ``how_to_get`` it."""
    raw = os.environ.get(env_var)
    path = Path(raw) if raw else PROJECT_ROOT / default
    if not path.exists():
        pytest.skip(f"no binary at {path} (set {env_var} or {how_to_get})")
    return path
