"""The fake member's llama.cpp slots: a prompt cache per slot, a prefill cost, the slot API.

What llama.cpp's server README documents, and what this file plays:

* ``GET /slots``: one object per slot, ``id``, ``n_ctx``, ``is_processing`` (the idle probe
  and the paced release read it).
* ``POST /slots/{id}?action=save`` with ``{"filename": ...}`` writes the slot's prompt cache
  under ``--slot-save-path``: ``{"id_slot", "filename", "n_saved", "n_written",
  "timings": {"save_ms"}}``; ``action=restore``: ``{"id_slot", "filename", "n_restored",
  "n_read", "timings": {"restore_ms"}}``; ``action=erase``: ``{"id_slot", "n_erased"}``.
  Without a save path the server answers 501 (``not_supported_error``); a bad filename, 400.
* A completion runs in one slot (``id_slot`` in the body, else an idle slot whose cache shares
  the longest prefix with the prompt, as llama.cpp's ``cache_prompt`` picks one) and pays a
  prefill cost for the prompt tokens its cache lacks only; its ``timings`` say ``cache_n``
  (tokens reused) and ``prompt_n`` (tokens processed). With every slot busy it waits for one.

A token here is a whitespace-separated word. ``restore_effect="none"`` plays the model types
whose restore llama.cpp reports but does not use (sliding-window / hybrid attention,
llama.cpp #25913): ``n_restored`` is counted, the next request's ``cache_n`` is 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

SLOTS_ENV = "MODELPOOL_UPSTREAM_SLOTS"
PREFILL_ENV = "MODELPOOL_UPSTREAM_PREFILL_MS_PER_TOKEN"
SLOT_SAVE_PATH_ENV = "MODELPOOL_UPSTREAM_SLOT_SAVE_PATH"
RESTORE_EFFECT_ENV = "MODELPOOL_UPSTREAM_RESTORE_EFFECT"
# Members (comma-separated names) whose GET /slots always reads idle: the misconfigured idle
# probe of LLMKube #1800 / #1830, for the probe cross-check's e2e test.
BLIND_SLOTS_ENV = "MODELPOOL_UPSTREAM_BLIND_SLOTS"
N_CTX = 65536
MAX_PREFILL_S = 60.0  # bounds one request's simulated prefill, whatever the cost per token
# llama.cpp's filename check: no path separators, no leading dot, nothing empty.
_FILENAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,200}$")


def env_float(name: str, default: float) -> float:
    """A float from the environment, ``default`` when unset."""
    raw = os.environ.get(name, "")
    return float(raw) if raw.strip() else default


@dataclass
class Slot:
    """One slot: the tokens its prompt cache holds, and whether a request runs in it."""

    id: int
    cache: list[str] = field(default_factory=list)
    busy: bool = False
    last_used: float = 0.0


@dataclass(frozen=True, slots=True)
class Prefill:
    """What one request's prefill cost: tokens reused from the cache, tokens processed."""

    slot: int
    cache_n: int
    prompt_n: int
    prompt_ms: float

    def timings(self) -> dict[str, Any]:
        """The llama.cpp ``timings`` fields a response carries for its prompt."""
        return {"cache_n": self.cache_n, "prompt_n": self.prompt_n,
                "prompt_ms": round(self.prompt_ms, 3)}


def _common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response({"error": {"code": status, "message": message, "type": kind}},
                             status=status)


class Slots:
    """The member's slots, their caches, and the slot API's handlers."""

    def __init__(self, n_slots: int, prefill_ms_per_token: float = 0.0,
                 save_path: Path | None = None, restore_effect: str = "full",
                 blind: bool = False) -> None:
        # 0: as many slots as requests come (no request waits; the tests' default member)
        self.bounded = n_slots > 0
        self.slots = [Slot(i) for i in range(max(1, n_slots))]
        self.prefill_ms_per_token = prefill_ms_per_token
        self.save_path = save_path
        self.restore_effect = restore_effect
        self.blind = blind  # GET /slots reads idle whatever runs
        self._free = asyncio.Condition()
        self._spare: list[int] = [0] if not self.bounded else []  # unbounded: idle slot ids

    @classmethod
    def from_env(cls, n_slots: int | None, member: str = "") -> "Slots":
        """Slots as the environment configures them for ``member`` (the simulator sets it)."""
        path = os.environ.get(SLOT_SAVE_PATH_ENV, "")
        return cls(n_slots if n_slots is not None else int(env_float(SLOTS_ENV, 0)),
                   env_float(PREFILL_ENV, 0.0), Path(path) if path else None,
                   os.environ.get(RESTORE_EFFECT_ENV, "full") or "full",
                   blind=member in os.environ.get(BLIND_SLOTS_ENV, "").split(","))

    def add_routes(self, app: web.Application) -> None:
        """Serve ``GET /slots`` and ``POST /slots/{id}`` on ``app``."""
        app.router.add_get("/slots", self.list_view)
        app.router.add_post("/slots/{id_slot}", self.action)

    # ---- a completion's slot ---------------------------------------------------------------

    async def prefill(self, prompt: list[str], wanted: int | None = None) -> Prefill:
        """Take a slot for ``prompt`` (waiting for one), pay for its uncached tokens."""
        async with self._free:
            slot = await self._free.wait_for(lambda: self._pick(prompt, wanted))
            slot.busy = True
        reused = _common_prefix(slot.cache, prompt)
        if reused == len(prompt) and reused:
            reused -= 1  # llama.cpp always evaluates the last prompt token again
        cost_ms = min(MAX_PREFILL_S * 1000, (len(prompt) - reused) * self.prefill_ms_per_token)
        try:
            if cost_ms > 0:
                await asyncio.sleep(cost_ms / 1000)
        except BaseException:
            await self.release(slot.id, slot.cache)
            raise
        slot.cache = list(prompt)
        return Prefill(slot.id, reused, len(prompt) - reused, cost_ms)

    async def release(self, slot_id: int, cache: list[str]) -> None:
        """The request in ``slot_id`` ended: its cache is ``cache`` (prompt plus answer)."""
        slot = self.slots[slot_id]
        async with self._free:
            slot.busy, slot.cache, slot.last_used = False, list(cache), time.monotonic()
            if not self.bounded:
                self._spare.append(slot_id)
            self._free.notify_all()

    def _pick(self, prompt: list[str], wanted: int | None) -> Slot | None:
        if wanted is not None and 0 <= wanted < len(self.slots):
            slot = self.slots[wanted]
            if slot.busy:
                return None
            if wanted in self._spare:
                self._spare.remove(wanted)
            return slot
        if not self.bounded:
            # one slot per request at once, found in O(1): a burst of thousands (the release
            # tests) must not cost a prefix search over every slot per request
            if not self._spare:
                self.slots.append(Slot(len(self.slots)))
                return self.slots[-1]
            return self.slots[self._spare.pop()]
        idle = [s for s in self.slots if not s.busy]
        if not idle:
            return None
        # the longest shared prefix wins; among none, the least recently used slot
        return max(idle, key=lambda s: (_common_prefix(s.cache, prompt), -s.last_used))

    # ---- the slot API ----------------------------------------------------------------------

    async def list_view(self, request: web.Request) -> web.Response:
        """``GET /slots``."""
        return web.json_response([{"id": s.id, "n_ctx": N_CTX,
                                   "is_processing": s.busy and not self.blind}
                                  for s in self.slots])

    async def action(self, request: web.Request) -> web.Response:
        """``POST /slots/{id}?action=save|restore|erase``."""
        try:
            slot = self.slots[int(request.match_info["id_slot"])]
        except (ValueError, IndexError):
            return _error(400, "Invalid slot ID", "invalid_request_error")
        action = request.query.get("action", "")
        if action == "erase":
            erased, slot.cache = len(slot.cache), []
            return web.json_response({"id_slot": slot.id, "n_erased": erased})
        if action not in ("save", "restore"):
            return _error(400, "Invalid action", "invalid_request_error")
        if self.save_path is None:
            return _error(501, "This server does not support slots action. Start it with "
                          "`--slot-save-path`", "not_supported_error")
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        filename = body.get("filename") if isinstance(body, dict) else None
        if not isinstance(filename, str) or not _FILENAME.match(filename) \
                or filename.endswith("."):
            return _error(400, "Invalid filename", "invalid_request_error")
        if slot.busy:
            return _error(400, "Slot is busy", "invalid_request_error")
        began, path = time.monotonic(), self.save_path / filename
        if action == "save":
            data = json.dumps({"tokens": slot.cache}).encode()
            await asyncio.to_thread(_write, path, data)
            return web.json_response({"id_slot": slot.id, "filename": filename,
                                      "n_saved": len(slot.cache), "n_written": len(data),
                                      "timings": {"save_ms": _ms_since(began)}})
        try:
            data = await asyncio.to_thread(path.read_bytes)
            tokens = [str(t) for t in json.loads(data)["tokens"]]
        except (OSError, ValueError, KeyError, TypeError):
            return _error(400, "Unable to restore slot, no available space in KV cache or "
                          "invalid slot save file", "invalid_request_error")
        slot.cache = tokens if self.restore_effect == "full" else []
        return web.json_response({"id_slot": slot.id, "filename": filename,
                                  "n_restored": len(tokens), "n_read": len(data),
                                  "timings": {"restore_ms": _ms_since(began)}})


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _ms_since(began: float) -> float:
    return round((time.monotonic() - began) * 1000, 3)
