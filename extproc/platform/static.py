"""Pools from a YAML file, with members that load instantly: routing without Kubernetes.

For a single host, or for trying the data path: every member is assumed to be always
reachable, and a "swap" only flips which one the router sends traffic to. The file::

    pools:
      - namespace: demo            # optional, default "default"
        name: shared-gpu
        members: [judge, coder]
        default: judge             # optional
        swapBudget: 300s           # optional
        fairnessWindow: 30s        # optional
        aliases: {gpt-4o-mini: judge}   # optional
        endpoints:                 # --endpoint-picker: each member's pods, ip:port
          judge: [127.0.0.2:8080]
          coder: ["[fd00::3]:8080"]     # IPv6 in brackets (quoted: YAML reads [ as a list)
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml

from ..policy.events import Notice
from ..policy.model import MemberObservation, PoolKey, PoolSpec, PoolView, StartHints
from ..settings import ConfigError, Settings, parse_duration
from . import hostport
from .contract import CarryResult, PoolListener


#: Each member's pods as ``ip:port`` (``hostport``), per pool (a pools file's ``endpoints``).
Endpoints = dict[PoolKey, dict[str, tuple[str, ...]]]


def load_specs(path: str | Path, settings: Settings) -> list[PoolSpec]:
    """Parse and validate a static pools file; ConfigError (one line) when it is unusable."""
    pools = _pools(path)
    try:
        return [_spec(entry, settings, f"{path}: pools[{i}]") for i, entry in enumerate(pools)]
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def load_endpoints(path: str | Path, specs: list[PoolSpec], settings: Settings) -> Endpoints:
    """The pools file's member endpoints; with --endpoint-picker every member needs one."""
    found: Endpoints = {}
    for i, (entry, spec) in enumerate(zip(_pools(path), specs, strict=True)):
        where = f"{path}: pools[{i}].endpoints"
        given = entry.get("endpoints") or {}
        if not isinstance(given, dict) or set(given) - set(spec.members):
            raise ConfigError(f"{where}: expected a map from member names to ip:port lists")
        found[spec.key] = {m: _endpoints(given.get(m) or [], f"{where}.{m}")
                           for m in spec.members}
        missing = [m for m, eps in found[spec.key].items() if not eps]
        if settings.endpoint_picker and missing:
            raise ConfigError(f"{where}: --endpoint-picker needs endpoints for {missing}")
    return found


def _endpoints(given: object, where: str) -> tuple[str, ...]:
    """A member's endpoints as written canonically (``hostport.parse``)."""
    if not isinstance(given, list):
        raise ConfigError(f"{where}: expected a list of ip:port")
    try:
        return tuple(hostport.parse(str(endpoint)) for endpoint in given)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _pools(path: str | Path) -> list:
    """The ``pools`` list of a pools file; ConfigError when the file is unreadable."""
    try:
        document = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"pools file {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"pools file {path}: not valid YAML{where}") from None
    pools = document.get("pools") if isinstance(document, dict) else None
    if not isinstance(pools, list) or not pools:
        raise ConfigError(f"{path}: expected a non-empty 'pools' list")
    return pools


def _spec(entry: Any, settings: Settings, where: str) -> PoolSpec:
    if not isinstance(entry, dict) or not entry.get("name"):
        raise ValueError(f"{where}: each pool needs a name")
    members = entry.get("members")
    if not isinstance(members, list) or not members or \
            not all(isinstance(m, str) and m for m in members):
        raise ValueError(f"{where}: members must be a non-empty list of names")
    default = str(entry.get("default") or "")
    if default and default not in members:
        raise ValueError(f"{where}: default {default!r} is not a member")
    aliases = {str(k): str(v) for k, v in (entry.get("aliases") or {}).items()}
    unknown = sorted(v for v in aliases.values() if v not in members)
    if unknown:
        raise ValueError(f"{where}: aliases point at non-members {unknown}")
    return PoolSpec(
        key=PoolKey(str(entry.get("namespace") or "default"), str(entry["name"])),
        members=tuple(members), default=default,
        swap_budget=parse_duration(entry.get("swapBudget", settings.swap_budget)),
        fairness_window=parse_duration(entry.get("fairnessWindow",
                                                  settings.fairness_window)),
        aliases=aliases)


class StaticPlatform:
    """A Platform whose members are always reachable and scale instantly."""

    def __init__(self, specs: list[PoolSpec], endpoints: Endpoints | None = None) -> None:
        self._specs = specs
        self._endpoints = endpoints or {}
        self._listener: PoolListener | None = None
        self._synced = asyncio.Event()

    @property
    def synced(self) -> asyncio.Event:
        """Set once every pool has been announced."""
        return self._synced

    async def run(self, listener: PoolListener) -> None:
        """Announce every pool and its (cold) members to ``listener``."""
        self._listener = listener
        for spec in self._specs:
            listener.pool_changed(spec, StartHints())
            for member in spec.members:
                listener.member_changed(spec.key, MemberObservation(member, phase="Stopped"))
                listener.endpoints_changed(spec.key, member, ())
        self._synced.set()

    async def stop(self, clean: bool = True) -> None:
        """Nothing runs in the background."""

    async def scale(self, key: PoolKey, member: str, replicas: int) -> None:
        """Apply the new replica count at once."""
        assert self._listener is not None
        phase = "Ready" if replicas else "Stopped"
        self._listener.member_changed(key, MemberObservation(member, phase=phase,
                                                             replicas=replicas,
                                                             pods=replicas))
        # its pods answer on their addresses only while it runs
        self._listener.endpoints_changed(
            key, member, self._endpoints.get(key, {}).get(member, ()) if replicas else ())

    async def trigger(self, key: PoolKey, member: str) -> None:
        """No LLMKube here (settings refuse llmkube mode with a pools file): load at once."""
        await self.scale(key, member, 1)

    async def probe_idle(self, key: PoolKey, member: str) -> bool | None:
        """Static members are never asked; report idle."""
        return True

    async def carry_slots(self, key: PoolKey, member: str, step: str) -> CarryResult:
        """Static members have no slot API this service knows of: nothing is carried."""
        return CarryResult(False, "a pools file's members carry no prompt cache")

    def publish(self, view: PoolView) -> None:
        """No status to keep: /debug/pools reads the drivers' views."""

    def notify(self, key: PoolKey, notice: Notice) -> None:
        """Nothing to record beyond the driver's log line."""

    @property
    def elects(self) -> bool:
        """A pools file serves one replica: it leads every pool from the start."""
        return False

    def announce(self, key: PoolKey, target: str) -> None:
        """One replica, no peers: nobody to announce a drain to."""

    def load_changed(self, urgent: bool) -> None:
        """No peers read the counts."""

    async def leave(self) -> None:
        """No leadership to hand over."""
