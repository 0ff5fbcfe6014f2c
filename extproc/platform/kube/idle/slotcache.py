"""Save and restore a llama.cpp server's prompt cache through its slot API.

As llama.cpp's server README documents it: ``GET /slots`` lists the slots (``id``);
``POST /slots/{id}?action=save`` with ``{"filename": ...}`` writes one slot's cache under the
server's ``--slot-save-path`` and answers ``n_saved`` (tokens) and ``n_written`` (bytes);
``action=restore`` reads it back and answers ``n_restored`` and ``n_read``. A server started
without ``--slot-save-path`` answers 501.

Files are named by namespace, member, model and slot, so two members (or two models of one
member over time) never read each other's cache. A restore counts as taken effect when some
slot restored tokens; a missing file (nothing was saved for that slot) is not an error.
llama.cpp may report restored tokens that the next request does not reuse (sliding-window and
hybrid attention models, llama.cpp #25913): only the request's ``timings.cache_n`` shows that,
and this service does not read response bodies (docs/operations.md, "Prompt-cache carry-over").
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import aiohttp

from extproc.platform.contract import CarryResult

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def slot_file(namespace: str, member: str, model: str, slot: int) -> str:
    """The save file of one slot: ``<namespace>-<member>-<model>-slot<id>.bin``, in the
    characters llama.cpp's filename check accepts."""
    name = "-".join(_UNSAFE.sub("_", part) for part in (namespace, member, model))
    return f"{name.lstrip('.')}-slot{slot}.bin"


async def _json(resp: aiohttp.ClientResponse) -> object:
    try:
        return json.loads(await resp.read())
    except ValueError:
        return None


def _error(body: object, status: int) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return f"{status} {body['error'].get('message', '')}".strip()
    return str(status)


async def carry(session: aiohttp.ClientSession, slots_url: str, step: str,
                file_of: Callable[[int], str]) -> CarryResult:
    """Save or restore every slot the server at ``slots_url`` (its ``/slots``) lists.

    ``file_of(slot_id)`` names each slot's file. Any failure is reported in the result.
    """
    try:
        async with session.get(slots_url) as resp:
            slots = await _json(resp)
            if resp.status != 200 or not isinstance(slots, list):
                return CarryResult(False, f"GET /slots: {_error(slots, resp.status)}")
        ids = [s["id"] for s in slots if isinstance(s, dict) and isinstance(s.get("id"), int)]
        if not ids:
            return CarryResult(False, "GET /slots listed no slots")
        tokens, done, missing, problems = 0, 0, 0, []
        for slot in ids:
            url = f"{slots_url}/{slot}?action={step}"
            async with session.post(url, json={"filename": file_of(slot)}) as resp:
                body = await _json(resp)
                if resp.status == 200 and isinstance(body, dict):
                    tokens += int(body.get("n_saved" if step == "save" else "n_restored") or 0)
                    done += 1
                elif step == "restore" and resp.status == 400:
                    missing += 1  # no file for it (never saved, or saved empty and gone)
                else:
                    problems.append(f"slot {slot}: {_error(body, resp.status)}")
    except (aiohttp.ClientError, OSError, ValueError, TypeError) as exc:
        return CarryResult(False, f"{type(exc).__name__}: {exc}")
    summary = f"{done} of {len(ids)} slots, {tokens} tokens"
    if problems:
        return CarryResult(False, f"{summary}; {'; '.join(problems)}", tokens, done)
    if step == "restore" and tokens == 0:
        return CarryResult(False, f"restore took no effect ({summary}, {missing} without a "
                           "file)", tokens, done)
    return CarryResult(True, summary, tokens, done)
