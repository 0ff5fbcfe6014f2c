"""The fake member's OpenAI answers: completions and chat (streamed or not), embeddings, audio."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, AsyncIterator

from aiohttp import web

from devstack.fakemember_slots import Prefill, Slots

DEFAULT_TOKENS = 16
MAX_TOKENS = 200  # bounds every generated answer (and so every stream's duration)


class Answers:
    """The /v1 handlers of one member: its name in every answer, its token pace, its slots."""

    def __init__(self, name: str, token_delay_ms: float, slots: Slots):
        self.name = name
        self.token_delay_ms = token_delay_ms
        self.slots = slots

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        messages = body.get("messages") or []
        prompt = str(messages[-1].get("content", "")) if messages else ""
        tokens = self._tokens(prompt, body)
        model = body.get("model", self.name)
        # the slot's cache holds the whole conversation, as a chat template would render it
        context = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        prefill = await self.slots.prefill(context.split(), _slot_of(body))
        done = context.split() + tokens
        if body.get("stream"):
            return await self._stream(request, body, model, tokens, prefill, done, chat=True)
        await self.slots.release(prefill.slot, done, prefill, len(tokens))
        text = " ".join(tokens)
        return web.json_response(
            {
                **_envelope("chatcmpl", "chat.completion", model),
                "timings": prefill.timings(len(tokens)),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                    }
                ],
                "usage": _usage(prefill, tokens),
            }
        )

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        prompt = str(body.get("prompt", ""))
        tokens = self._tokens(prompt, body)
        model = body.get("model", self.name)
        prefill = await self.slots.prefill(prompt.split(), _slot_of(body))
        done = prompt.split() + tokens
        if body.get("stream"):
            return await self._stream(request, body, model, tokens, prefill, done, chat=False)
        await self.slots.release(prefill.slot, done, prefill, len(tokens))
        return web.json_response(
            {
                **_envelope("cmpl", "text_completion", model),
                "timings": prefill.timings(len(tokens)),
                "choices": [{"index": 0, "text": " ".join(tokens), "finish_reason": "stop"}],
                "usage": _usage(prefill, tokens),
            }
        )

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        inputs = body.get("input", "")
        inputs = [inputs] if isinstance(inputs, str) else list(inputs)
        data = [
            {"object": "embedding", "index": i, "embedding": _vector(f"{self.name}:{text}")}
            for i, text in enumerate(inputs)
        ]
        n = sum(len(str(text).split()) for text in inputs)
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "model": body.get("model", self.name),
                "usage": {"prompt_tokens": n, "total_tokens": n},
            }
        )

    async def transcriptions(self, request: web.Request) -> web.StreamResponse:
        if not request.content_type.startswith("multipart/"):
            return _error(400, "expected multipart/form-data")
        size, filename = 0, ""
        reader = await request.multipart()
        async for part in reader:
            if part.name == "file":
                filename = part.filename or ""
                while chunk := await part.read_chunk():
                    size += len(chunk)
            else:
                await part.release()
        if not filename and size == 0:
            return _error(400, "missing multipart field 'file'")
        return web.json_response({"text": f"[{self.name}] transcribed {size} bytes of {filename}"})


    async def models(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": self.name, "object": "model", "owned_by": "devstack"}],
            }
        )


    def _tokens(self, prompt: str, body: dict[str, Any]) -> list[str]:
        requested = body.get("max_tokens") or body.get("max_completion_tokens") or DEFAULT_TOKENS
        try:
            n = max(1, min(int(requested), MAX_TOKENS))
        except (TypeError, ValueError):
            n = DEFAULT_TOKENS
        words = [f"[{self.name}]", "you", "said:"] + prompt.split()
        words += [f"t{i}" for i in range(len(words), n)]
        return words[:n]

    async def _stream(self, request: web.Request, body: dict[str, Any], model: str,
                      tokens: list[str], prefill: Prefill, done: list[str],
                      chat: bool) -> web.StreamResponse:
        sent: list[str] = []
        try:
            return await self._send_stream(request, body, model, tokens, prefill, chat, sent)
        finally:
            # a hang-up frees the slot too, with what was generated until then (llama.cpp
            # stops a generation whose client is gone)
            await self.slots.release(prefill.slot, done[:len(done) - len(tokens) + len(sent)],
                                     prefill, len(sent))

    async def _send_stream(self, request: web.Request, body: dict[str, Any], model: str,
                           tokens: list[str], prefill: Prefill, chat: bool,
                           sent: list[str]) -> web.StreamResponse:
        delay = _delay_seconds(request, self.token_delay_ms)
        resp = web.StreamResponse(
            headers={"content-type": "text/event-stream", "cache-control": "no-cache"}
        )
        await resp.prepare(request)
        kind = ("chatcmpl", "chat.completion.chunk") if chat else ("cmpl", "text_completion")
        env = _envelope(*kind, model)
        first = True
        async for token in _paced(tokens, delay):
            text = token if first else " " + token
            if chat:
                delta = {"role": "assistant", "content": text} if first else {"content": text}
                choice = {"index": 0, "delta": delta, "finish_reason": None}
            else:
                choice = {"index": 0, "text": text, "finish_reason": None}
            await _send_event(resp, {**env, "choices": [choice]})
            sent.append(token)
            first = False
        final = {"index": 0, "finish_reason": "stop"}
        final.update({"delta": {}} if chat else {"text": ""})
        timings, usage = prefill.timings(len(tokens)), _usage(prefill, tokens)
        options = body.get("stream_options")
        if chat and isinstance(options, dict) and options.get("include_usage"):
            # llama.cpp (as OpenAI): the usage in one more chunk, with no choices
            await _send_event(resp, {**env, "choices": [final]})
            await _send_event(resp, {**env, "choices": [], "usage": usage, "timings": timings})
        elif chat:
            await _send_event(resp, {**env, "choices": [final], "timings": timings})
        else:  # llama.cpp's text completions stream ends with the usage always
            await _send_event(resp, {**env, "choices": [final], "usage": usage,
                                     "timings": timings})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _slot_of(body: dict[str, Any]) -> int | None:
    """The ``id_slot`` a request asks for (llama.cpp's field), if a valid one."""
    slot = body.get("id_slot")
    return slot if isinstance(slot, int) and not isinstance(slot, bool) and slot >= 0 else None


async def _paced(tokens: list[str], delay: float) -> AsyncIterator[str]:
    for token in tokens:
        if delay > 0:
            await asyncio.sleep(delay)
        yield token


async def _send_event(resp: web.StreamResponse, payload: dict[str, Any]) -> None:
    await resp.write(b"data: " + json.dumps(payload).encode() + b"\n\n")


def _delay_seconds(request: web.Request, default_ms: float) -> float:
    raw = request.query.get("delay_ms")
    try:
        ms = float(raw) if raw is not None else default_ms
    except ValueError:
        ms = default_ms
    # Bounded so a stream never outlives MAX_TOKENS seconds.
    return max(0.0, min(ms, 1000.0)) / 1000.0


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise web.HTTPBadRequest(
            text=json.dumps(_error_body("request body is not valid JSON")),
            content_type="application/json",
        ) from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(
            text=json.dumps(_error_body("request body must be a JSON object")),
            content_type="application/json",
        )
    return body


def _error(status: int, message: str) -> web.Response:
    return web.json_response(_error_body(message), status=status)


def _error_body(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": None}}


def _envelope(prefix: str, obj: str, model: str) -> dict[str, Any]:
    return {
        "id": f"{prefix}-{uuid.uuid4().hex[:24]}",
        "object": obj,
        "created": int(time.time()),
        "model": model,
    }


def _usage(prefill: Prefill, tokens: list[str]) -> dict[str, Any]:
    # as llama.cpp counts: the whole prompt, cached tokens included, and how many were cached
    p = prefill.cache_n + prefill.prompt_n
    return {"prompt_tokens": p, "completion_tokens": len(tokens), "total_tokens": p + len(tokens),
            "prompt_tokens_details": {"cached_tokens": prefill.cache_n}}


def _vector(text: str, dims: int = 8) -> list[float]:
    # Deterministic per (member, input) so tests can compare answers.
    seed = sum(text.encode())
    return [round(((seed * (i + 7)) % 997) / 997.0, 6) for i in range(dims)]

