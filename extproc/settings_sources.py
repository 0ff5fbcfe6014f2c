"""Settings from their sources: one flag per field, its environment variable, the default.

The fields themselves, their help and their checks are ``settings.py``'s; this module only
reads them: ``add_arguments`` declares the flags, ``from_sources`` resolves flag, then
environment, then default, converts and validates.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from .settings import ENV_PREFIX, ConfigError, Settings, parse_duration, validate

_DURATION_FIELDS = {"shutdown_grace", "connection_idle_timeout", "carry_timeout",
                    "swap_budget", "fairness_window", "drain_linger", "swap_timeout",
                    "failure_backoff", "idle_probe_timeout", "probe_retry", "park_margin",
                    "stall_after", "activation_grace", "hands_off_quiet", "idle_report",
                    "watch_timeout", "api_retry_initial", "api_retry_max", "api_request_timeout",
                    "route_check_interval", "metrics_idle_timeout", "first_message_timeout",
                    *("membership_lease_duration", "membership_renew", "lease_margin",
                      "membership_write_interval", "leader_lease_duration",
                      "leader_renew_deadline", "leader_retry", "lost_replica_wait")}


def format_duration(seconds: float) -> str:
    """Seconds as a duration flag value: 300 -> "300s", 0.5 -> "500ms", 1.5 -> "1.5s"."""
    if 0 < seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:g}s"


def _convert(name: str, kind: Any, raw: Any) -> Any:
    if name in _DURATION_FIELDS:
        return parse_duration(raw)
    if kind in (bool, "bool"):
        if isinstance(raw, bool):
            return raw
        lowered = str(raw).strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(f"{name}: expected true/false, got {raw!r}")
    if kind in (int, "int"):
        return int(raw)
    if kind in (list[str], "list[str]"):
        items = raw if isinstance(raw, list) else [raw]
        return [part.strip() for item in items for part in str(item).split(",") if part.strip()]
    return str(raw)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per settings field, grouped as in the dataclass, to ``parser``."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in dataclasses.fields(Settings):
        group_name = f.metadata["group"]
        group = groups.get(group_name) or parser.add_argument_group(group_name)
        groups[group_name] = group
        flag = f.metadata["flag"] or "--" + f.name.replace("_", "-")
        env = ENV_PREFIX + f.name.upper()
        default = (f.default if f.default is not dataclasses.MISSING
                   else f.default_factory())  # type: ignore[operator]  # MISSING is not narrowed
        if f.name in _DURATION_FIELDS:
            default = format_duration(default)
        shown = "" if default in ("", []) else f" (default: {default})"
        # argparse formats help with %: a literal one in a text (say "10 %") must be doubled
        help_text = f"{f.metadata['help']}{shown} [env {env}]".replace("%", "%%")
        if f.type in (bool, "bool"):
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                               default=None, help=help_text)
        elif f.type in (list[str], "list[str]"):
            group.add_argument(flag, dest=f.name, action="append", default=None,
                               metavar=f.metadata["metavar"], help=help_text)
        else:
            group.add_argument(flag, dest=f.name, default=None,
                               metavar=f.metadata["metavar"], help=help_text)


def from_sources(args: argparse.Namespace | None = None,
                 environ: Mapping[str, str] | None = None) -> Settings:
    """Build Settings from parsed flags, then the environment, then the defaults."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for f in dataclasses.fields(Settings):
        raw = getattr(args, f.name, None) if args is not None else None
        if raw is None:
            raw = environ.get(ENV_PREFIX + f.name.upper())
        if raw is None:
            continue
        try:
            values[f.name] = _convert(f.name, f.type, raw)
        except ValueError as exc:
            raise ConfigError(f"bad value for {f.name}: {exc}") from None
    settings = Settings(**values)
    problem = validate(settings)
    if problem:
        raise ConfigError(problem)
    return settings
