"""The fake member's llama.cpp slots: a prompt cache per slot, a prefill cost, the slot API.

What llama.cpp's server (the pinned build, tests/test_fakemember_vs_llamacpp.py) does, and what
this file plays:

* ``GET /slots``: one object per slot, ``id``, ``n_ctx``, ``is_processing`` (the idle probe
  and the paced release read it).
* ``GET /metrics``: llama.cpp's counters and gauges (devstack/fakemember_metrics.py).
* ``POST /slots/{id}?action=save`` with ``{"filename": ...}`` writes the slot's prompt cache
  under ``--slot-save-path``: ``{"id_slot", "filename", "n_saved", "n_written",
  "timings": {"save_ms"}}``; ``action=restore``: ``{"id_slot", "filename", "n_restored",
  "n_read", "timings": {"restore_ms"}}``; ``action=erase``: ``{"id_slot", "n_erased"}``.
  Without a save path every action answers 501 (``not_supported_error``), before the slot id
  is even read; a slot id that is no integer, a bad action or filename, 400; a body that is no
  JSON or has no string ``filename``, 500 (``server_error``: llama.cpp's JSON exception). An
  action on a busy slot waits for it (llama.cpp defers the task), it is not refused. A failed
  restore leaves the slot empty.
* A completion runs in one slot, chosen as llama.cpp does: ``id_slot`` in the body (wrapped
  modulo the slot count), else the idle slot whose cache shares more than 10% of the prompt
  (the largest share), else the least recently used idle slot. It pays a prefill cost for the
  prompt tokens its cache lacks only; its ``timings`` say ``cache_n`` (tokens reused) and
  ``prompt_n`` (tokens processed). With every slot busy it waits for one.
* llama.cpp's in-RAM prompt cache (``--cache-ram``, on by default): a slot's cache that is
  about to be replaced, and every idle slot's cache when a request starts, is kept in RAM; a
  request whose slot holds less of its prompt than a kept entry gets that entry loaded into
  the slot. So within one process a prompt pushed out of its slot by another still hits
  later. ``MODELPOOL_UPSTREAM_CACHE_RAM_TOKENS=0`` plays ``--cache-ram 0``. It lives in the
  process: a restart (a swap) starts with it empty, only a slot restore carries a cache over.

A token here is a whitespace-separated word. ``restore_effect="none"`` plays the model types
whose restore llama.cpp reports but does not use (sliding-window / hybrid attention,
llama.cpp #25913): ``n_restored`` is counted, the next request's ``cache_n`` is 0.

Known differences kept (listed in tests/test_fakemember_vs_llamacpp.py): the service reads none
of them, and existing tests pin the fake's answers.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from devstack.fakemember_metrics import Metrics, exposition

SLOTS_ENV = "MODELPOOL_UPSTREAM_SLOTS"
PREFILL_ENV = "MODELPOOL_UPSTREAM_PREFILL_MS_PER_TOKEN"
SLOT_SAVE_PATH_ENV = "MODELPOOL_UPSTREAM_SLOT_SAVE_PATH"
RESTORE_EFFECT_ENV = "MODELPOOL_UPSTREAM_RESTORE_EFFECT"
# tokens the in-RAM prompt cache keeps (llama.cpp's --cache-ram, in MiB there); 0: none
CACHE_RAM_ENV = "MODELPOOL_UPSTREAM_CACHE_RAM_TOKENS"
DEFAULT_CACHE_RAM_TOKENS = 1_000_000
# Members (comma-separated names) whose GET /slots always reads idle: the misconfigured idle
# probe of LLMKube #1800 / #1830, for the probe cross-check's e2e test.
BLIND_SLOTS_ENV = "MODELPOOL_UPSTREAM_BLIND_SLOTS"
N_CTX = 65536
MAX_PREFILL_S = 60.0  # bounds one request's simulated prefill, whatever the cost per token
# llama.cpp's slot choice and prompt-cache thresholds (server-context.cpp, server-task.cpp)
SLOT_PROMPT_SIMILARITY = 0.1  # --slot-prompt-similarity
KEEP_BELOW = 0.5  # a slot about to lose more than half its cache saves it to RAM first
RAM_MIN_KEEP = 0.25  # a RAM entry is loaded only if the prompt reuses a quarter of it
# llama.cpp's fs_validate_filename: characters no file name may hold
_FORBIDDEN = set('/\\:*?"<>|') | {"\ufffd", "\ufeff", "\uff0e", "\u2215", "\u2216"}
RESTORE_FAILED = "Unable to restore slot: No available space in KV cache or invalid slot save file"


def env_float(name: str, default: float) -> float:
    """A float from the environment, ``default`` when unset."""
    raw = os.environ.get(name, "")
    return float(raw) if raw.strip() else default


def valid_filename(name: str) -> bool:
    """llama.cpp's check of a slot file name, and one rule more: no leading dot (llama.cpp
    takes ``.hidden``; the service never sends one, slotcache.slot_file strips it)."""
    if not 0 < len(name.encode()) <= 255 or name.startswith("."):
        return False
    if any(ord(c) <= 0x1F or 0x7F <= ord(c) <= 0x9F or 0xD800 <= ord(c) <= 0xDFFF
           or c in _FORBIDDEN for c in name):
        return False
    return not (name[0] == " " or name[-1] in " .") and ".." not in name


@dataclass
class Slot:
    """One slot: the tokens its prompt cache holds, and whether a request runs in it."""

    id: int
    cache: list[str] = field(default_factory=list)
    busy: bool = False
    last_used: float = -1.0  # never used: llama.cpp's t_last_used starts at -1
    acting: bool = False  # a slot action (save, restore, erase) has it: no request may start


@dataclass(frozen=True, slots=True)
class Prefill:
    """What one request's prefill cost: tokens reused from the cache, tokens processed."""

    slot: int
    cache_n: int
    prompt_n: int
    prompt_ms: float
    ready: float = 0.0  # time.monotonic() when the prefill ended and generation began

    def timings(self, predicted_n: int = 0) -> dict[str, Any]:
        """The llama.cpp ``timings`` a response carries: its prompt's, and its answer's
        (``predicted_n`` tokens, generated since the prefill ended)."""
        predicted_ms = max(0.001, (time.monotonic() - self.ready) * 1000) if self.ready else 0.0
        return {"cache_n": self.cache_n, "prompt_n": self.prompt_n,
                **_rate("prompt", self.prompt_n, self.prompt_ms),
                "predicted_n": predicted_n, **_rate("predicted", predicted_n, predicted_ms)}


def _rate(kind: str, n: int, ms: float) -> dict[str, float]:
    ms = round(ms, 3)
    # llama.cpp divides by zero here (inf, sent as null); a number is what clients expect
    return {f"{kind}_ms": ms, f"{kind}_per_token_ms": ms / n if n else 0.0,
            f"{kind}_per_second": 1000.0 * n / ms if ms > 0 else 0.0}


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
                 blind: bool = False, cache_ram_tokens: int = DEFAULT_CACHE_RAM_TOKENS) -> None:
        # 0: as many slots as requests come (no request waits; the tests' default member)
        self.bounded = n_slots > 0
        self.slots = [Slot(i) for i in range(max(1, n_slots))]
        self.prefill_ms_per_token = prefill_ms_per_token
        self.save_path = save_path
        self.restore_effect = restore_effect
        self.blind = blind  # GET /slots reads idle whatever runs
        # unbounded, no slot is ever reused for another prompt: nothing for a RAM cache to do
        self.cache_ram_tokens = cache_ram_tokens if self.bounded else 0
        self.ram: list[list[str]] = []  # the in-RAM prompt cache, oldest first
        self.metrics = Metrics()
        self.deferred = 0  # requests and slot actions waiting for their slot
        self._free = asyncio.Condition()
        self._spare: list[int] = [0] if not self.bounded else []  # unbounded: idle slot ids

    @classmethod
    def from_env(cls, n_slots: int | None, member: str = "",
                 save_path: str | None = None) -> "Slots":
        """Slots as the environment configures them for ``member`` (the simulator sets it);
        ``save_path``, when given, instead of the environment's --slot-save-path."""
        path = os.environ.get(SLOT_SAVE_PATH_ENV, "") if save_path is None else save_path
        return cls(n_slots if n_slots is not None else int(env_float(SLOTS_ENV, 0)),
                   env_float(PREFILL_ENV, 0.0), Path(path) if path else None,
                   os.environ.get(RESTORE_EFFECT_ENV, "full") or "full",
                   blind=member in os.environ.get(BLIND_SLOTS_ENV, "").split(","),
                   cache_ram_tokens=int(env_float(CACHE_RAM_ENV, DEFAULT_CACHE_RAM_TOKENS)))

    def add_routes(self, app: web.Application) -> None:
        """Serve ``GET /slots``, ``POST /slots/{id}`` and ``GET /metrics`` on ``app``."""
        app.router.add_get("/slots", self.list_view)
        app.router.add_post("/slots/{id_slot}", self.action)
        app.router.add_get("/metrics", self.metrics_view)

    # ---- a completion's slot ---------------------------------------------------------------

    async def prefill(self, prompt: list[str], wanted: int | None = None) -> Prefill:
        """Take a slot for ``prompt`` (waiting for one), pay for its uncached tokens."""
        async with self._free:
            picked = self._pick(prompt, wanted)
            if picked is None:
                self.deferred += 1
                try:
                    picked = await self._free.wait_for(lambda: self._pick(prompt, wanted))
                finally:
                    self.deferred -= 1
            slot, update = picked
            slot.busy = True
            if update:
                self._ram_swap(slot, prompt)
            # llama.cpp's --cache-idle-slots: a starting request publishes every idle slot
            for idle in self.slots if self.cache_ram_tokens else ():
                if not idle.busy:
                    self._ram_save(idle.cache)
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
        m = self.metrics
        m.prompt_tokens += len(prompt) - reused
        m.prompt_cached += reused
        m.prompt_seconds += cost_ms / 1000
        m.n_decode += 1
        m.n_busy_slots += sum(s.busy for s in self.slots)
        n, s = m.bucket_prompt
        m.bucket_prompt = (n + len(prompt) - reused, s + cost_ms / 1000)
        return Prefill(slot.id, reused, len(prompt) - reused, cost_ms, time.monotonic())

    async def release(self, slot_id: int, cache: list[str], prefill: Prefill | None = None,
                      predicted_n: int = 0) -> None:
        """The request in ``slot_id`` ended: its cache is ``cache`` (prompt plus answer);
        ``predicted_n`` tokens were generated since ``prefill`` ended (for ``/metrics``)."""
        slot = self.slots[slot_id]
        async with self._free:
            slot.busy, slot.cache, slot.last_used = False, list(cache), time.monotonic()
            if prefill is not None:
                seconds = max(0.0, time.monotonic() - prefill.ready)
                m = self.metrics
                m.predicted_tokens += predicted_n
                m.predicted_seconds += seconds
                m.n_decode += predicted_n
                m.n_busy_slots += predicted_n * (1 + sum(s.busy for s in self.slots))
                m.n_tokens_max = max(m.n_tokens_max, len(cache))
                n, s = m.bucket_predicted
                m.bucket_predicted = (n + predicted_n, s + seconds)
            if not self.bounded:
                self._spare.append(slot_id)
            self._free.notify_all()

    def _pick(self, prompt: list[str], wanted: int | None) -> tuple[Slot, bool] | None:
        """The slot for ``prompt`` and whether its cache goes through the RAM cache first
        (llama.cpp's get_available_slot); None: the slot wanted, or every slot, is busy."""
        if not self.bounded:
            return self._pick_unbounded(wanted)
        if wanted is not None:
            slot = self.slots[wanted % len(self.slots)]  # llama.cpp wraps an id out of range
            if slot.busy or slot.acting:
                return None
            if not slot.cache:
                return slot, False  # llama.cpp's f_keep is 0/0 here: no cache update
            lcp = _common_prefix(slot.cache, prompt)
            similar = bool(prompt) and lcp / len(prompt) > SLOT_PROMPT_SIMILARITY
            return slot, (lcp / len(slot.cache) < KEEP_BELOW) if similar else True
        idle = [s for s in self.slots if not (s.busy or s.acting)]
        if not idle:
            return None
        best, best_sim = None, 0.0
        for slot in idle:
            if slot.cache and prompt:
                sim = _common_prefix(slot.cache, prompt) / len(prompt)
                if sim > best_sim and sim > SLOT_PROMPT_SIMILARITY:
                    best, best_sim = slot, sim
        if best is not None:
            return best, best_sim * len(prompt) / len(best.cache) < KEEP_BELOW
        lru = idle[0]
        for slot in idle:
            if slot.last_used <= lru.last_used:  # llama.cpp's "<=": on a tie the last slot
                lru = slot
        return lru, True

    def _pick_unbounded(self, wanted: int | None) -> tuple[Slot, bool] | None:
        if wanted is not None and 0 <= wanted < len(self.slots):
            slot = self.slots[wanted]
            if slot.busy or slot.acting:
                return None
            if wanted in self._spare:
                self._spare.remove(wanted)
            return slot, False
        # one slot per request at once, found in O(1): a burst of thousands (the release
        # tests) must not cost a prefix search over every slot per request
        if not self._spare:
            self.slots.append(Slot(len(self.slots)))
            return self.slots[-1], False
        return self.slots[self._spare.pop()], False

    # ---- the in-RAM prompt cache (llama.cpp's server_prompt_cache) ------------------------

    def _ram_save(self, cache: list[str]) -> None:
        if not cache or not self.cache_ram_tokens or len(cache) > self.cache_ram_tokens:
            return
        if any(_common_prefix(entry, cache) == len(cache) for entry in self.ram):
            return  # already kept (as itself or inside a longer entry)
        self.ram = [e for e in self.ram if _common_prefix(e, cache) < len(e)]  # now obsolete
        while self.ram and sum(map(len, self.ram)) + len(cache) > self.cache_ram_tokens:
            self.ram.pop(0)
        self.ram.append(list(cache))

    def _ram_swap(self, slot: Slot, prompt: list[str]) -> None:
        """Keep the slot's cache in RAM, then load the entry that serves ``prompt`` better."""
        self._ram_save(slot.cache)
        lcp = _common_prefix(slot.cache, prompt)
        keep = lcp / len(slot.cache) if slot.cache else -1.0  # an empty slot: any entry wins
        sim = lcp / len(prompt) if prompt else 0.0
        best = None
        for entry in self.ram:
            n = _common_prefix(entry, prompt)
            f_keep, f_sim = n / len(entry), (n / len(prompt) if prompt else 0.0)
            if f_keep >= RAM_MIN_KEEP and keep < f_keep and sim < f_sim:
                best, keep, sim = entry, f_keep, f_sim
        if best is not None:
            self.ram.remove(best)  # llama.cpp moves the entry into the slot
            slot.cache = best

    # ---- the slot API ----------------------------------------------------------------------

    async def list_view(self, request: web.Request) -> web.Response:
        """``GET /slots``."""
        return web.json_response([{"id": s.id, "n_ctx": N_CTX,
                                   "is_processing": s.busy and not self.blind}
                                  for s in self.slots])

    async def metrics_view(self, request: web.Request) -> web.Response:
        """``GET /metrics``: llama.cpp's names, help texts and types."""
        return exposition(self.metrics, sum(s.busy for s in self.slots), self.deferred)

    async def action(self, request: web.Request) -> web.Response:
        """``POST /slots/{id}?action=save|restore|erase``, checked in llama.cpp's order."""
        if self.save_path is None:
            return _error(501, "This server does not support slots action. Start it with "
                          "`--slot-save-path`", "not_supported_error")
        try:
            slot = self.slots[int(request.match_info["id_slot"])]
        except (ValueError, IndexError):
            return _error(400, "Invalid slot ID", "invalid_request_error")
        action = request.query.get("action", "")
        if action not in ("save", "restore", "erase"):
            return _error(400, "Invalid action", "invalid_request_error")
        filename = ""
        if action != "erase":
            try:
                body = json.loads(await request.read())
                filename = body["filename"]
                if not isinstance(filename, str):
                    raise TypeError("type must be string, but is " + type(filename).__name__)
            except (ValueError, KeyError, TypeError) as exc:
                # llama.cpp's nlohmann::json throws and its handler answers 500
                return _error(500, f"{type(exc).__name__}: {exc}", "server_error")
            if not valid_filename(filename):
                return _error(400, "Invalid filename", "invalid_request_error")
        async with self._free:
            if slot.busy or slot.acting:  # llama.cpp defers the task until the slot is free
                self.deferred += 1
                try:
                    await self._free.wait_for(lambda: not (slot.busy or slot.acting))
                finally:
                    self.deferred -= 1
            slot.acting = True
        try:
            return await self._act(slot, action, filename)
        finally:
            async with self._free:
                slot.acting = False
                self._free.notify_all()

    async def _act(self, slot: Slot, action: str, filename: str) -> web.Response:
        if action == "erase":
            erased, slot.cache = len(slot.cache), []
            return web.json_response({"id_slot": slot.id, "n_erased": erased})
        assert self.save_path is not None
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
            slot.cache = []  # llama.cpp clears the slot when a restore fails
            return _error(400, RESTORE_FAILED, "invalid_request_error")
        if len(tokens) > N_CTX:
            slot.cache = []
            return _error(400, "Unable to restore slot: Restored prompt does not fit in the "
                          "slot context", "invalid_request_error")
        slot.cache = tokens if self.restore_effect == "full" else []
        return web.json_response({"id_slot": slot.id, "filename": filename,
                                  "n_restored": len(tokens), "n_read": len(data),
                                  "timings": {"restore_ms": _ms_since(began)}})


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _ms_since(began: float) -> float:
    return round((time.monotonic() - began) * 1000, 3)
