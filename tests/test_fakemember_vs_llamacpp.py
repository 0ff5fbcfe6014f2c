"""The fake member (devstack/fakemember.py, devstack/fakemember_slots.py) against llama.cpp's own
llama-server (``make llama-server``, on the generated models of devstack/tinymodel.py).

Each test plays one scenario on both servers and asserts that they agree on what the service
reads from a member: ``/health`` (503 while loading, and nothing else answering before it),
``/slots`` (``id``, ``is_processing``: the idle probe, the slot count, the carry-over), the
``llamacpp:*`` metrics an idle-metric annotation reads, the slot API's answers and status
codes (extproc/platform/kube/idle/slotcache.py), and a completion's ``timings`` and ``usage``.
Where the service's own client exists it is the one used (probe_idle, run_probe, slot_count,
carry), so the simulator cannot drift from the server the service meets in production.

Known differences, not asserted (the service reads none; the fake's answers are pinned by tests):
``x-served-by`` (fake only); ``model`` (llama.cpp: its ``--alias``; the fake: the request's);
``finish_reason`` (llama.cpp: ``length`` at ``max_tokens``); a chat body that is no JSON (the
fake: 400, llama.cpp: 500); ``/slots``' ``speculative``, per-task fields and ``n_ctx``; a slot
id out of range (llama.cpp wraps it); a leading-dot filename; ``n_saved`` (one more token in
the fake); the token counts themselves (words in the fake, a chat template's tokens in llama);
the connection after a streamed answer (llama.cpp closes it, though it sent ``Keep-Alive:
timeout=5, max=100``; the fake keeps it: the member routes' retry policy covers the close, and
e2e/test_e2e_llamacpp.py's paced herd shows it on the real server).

Skipped, saying how to build it, when llama-server is missing; under ``CI=true`` that fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devstack import llamacpp, tinymodel
from devstack.procs import LOCALHOST, PROJECT_ROOT, ManagedProcess, free_port
from devstack.testkit import finish_within
from devstack.fakemember import UpstreamHandle, start_upstream
from devstack.fakemember_slots import CACHE_RAM_ENV, SLOT_SAVE_PATH_ENV
from extproc.platform.kube.idle.probes import METRIC, IdleProbe, run_probe
from extproc.platform.kube.idle.prometheus import metric_sum
from extproc.platform.kube.idle.slotcache import carry
from extproc.platform.kube.idle.slots import probe_idle, slot_count

MODELS = PROJECT_ROOT / ".tools" / "llama.cpp" / "models"
LOAD_TIMEOUT = 60.0  # the large model loads in ~2 s; a busy machine gets room, not forever
STEP_TIMEOUT = 20.0  # any one wait on a running server
LOADING = {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}
PROCESSING = IdleProbe(METRIC, "/metrics", ("llamacpp:requests_processing",))
# fixed seed and no end-of-sequence: the random-weight model then answers max_tokens tokens
SAMPLING = {"seed": 1, "ignore_eos": True}
CONVERSATION = [{"role": "user", "content": "the a and the a and to the e " * 3}]
OTHER = [{"role": "user", "content": "e e e to to to and and " * 3}]


def _binary() -> Path:
    """The built llama-server; a skip saying how to build it, or under CI=true a failure."""
    try:
        return llamacpp.binary()
    except FileNotFoundError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{exc}; CI builds it, so a missing server is a failure, not a skip")
        pytest.skip(str(exc))


def _llama_args(binary: Path, model: Path, port: int, save_dir: Path | None,
                *extra: str) -> list[str]:
    """llama-server as devstack/llamacpp.py starts a member (2 slots, 512 tokens each)."""
    args = [str(binary), "-m", str(model), "--host", LOCALHOST, "--port", str(port),
            "-np", "2", "-c", "1024", "-t", "1", "--alias", "real", "--metrics", "--no-webui"]
    if save_dir is not None:
        args += ["--slot-save-path", f"{save_dir}{os.sep}"]
    return args + list(extra)


@dataclass
class Observed:
    """What a poll of a starting server saw: (/slots, /metrics, /health) answers per round."""

    # each answer a (status, body), or None while nothing listens on the port yet

    rounds: list[tuple[Any, Any, Any]] = field(default_factory=list)

    def add(self, row: tuple[Any, Any, Any]) -> None:
        """Keep a round unless it repeats the last one (a load is hundreds of equal rounds)."""
        if not self.rounds or self.rounds[-1] != row:
            self.rounds.append(row)


def _loading_violations(observed: Observed) -> list[tuple[Any, Any, Any]]:
    """Rounds where /slots or /metrics answered 200 while /health (asked after them, so it
    could only be later in the load) did not: a probe reading a server not yet loaded."""
    return [row for row in observed.rounds
            if (row[2] is None or row[2][0] != 200)
            and any(answer is not None and answer[0] == 200 for answer in row[:2])]


async def _get(http: aiohttp.ClientSession, url: str) -> tuple[int, Any] | None:
    """(status, JSON body or text) of GET url; None when nothing listens yet."""
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text)
            except ValueError:
                return resp.status, "text"  # /metrics: its content is checked elsewhere
    except (aiohttp.ClientConnectionError, asyncio.TimeoutError):
        return None


async def _watch_start(url: str, alive: Callable[[], bool], timeout: float) -> Observed:
    """Poll /slots, /metrics, /health of a starting server until /health is 200."""
    observed = Observed()
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while True:
            row = (await _get(http, f"{url}/slots"), await _get(http, f"{url}/metrics"),
                   await _get(http, f"{url}/health"))
            observed.add(row)
            if row[2] is not None and row[2][0] == 200:
                return observed
            assert alive(), "the server exited while starting"
            assert time.monotonic() < deadline, f"{url} not healthy within {timeout}s"
            await asyncio.sleep(0.005)


async def _until(check: Callable[[], Awaitable[bool]], what: str,
                 timeout: float = STEP_TIMEOUT) -> None:
    """Poll ``check`` until it is true; fail saying ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"not {what} within {timeout}s"
        await asyncio.sleep(0.01)


@dataclass
class Large:
    """The module's llama-server on the large model: its URL, process and observed start."""

    url: str
    process: ManagedProcess
    start: Observed


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Large]:
    """A llama-server on the large model, its ~2 s load watched from its first moment."""
    # shared: the load test and the generation test both need the large model, and one load
    # of it is the slowest step of this file
    binary = _binary()
    model = tinymodel.ensure(MODELS, "large")
    work = tmp_path_factory.mktemp("large")
    (work / "slots").mkdir()
    port = free_port()
    process = ManagedProcess(_llama_args(binary, model, port, work / "slots",
                                         "--load-mode", "none"), work / "llama.log")
    process.start()
    try:
        url = f"http://{LOCALHOST}:{port}"
        observed = asyncio.run(_watch_start(url, lambda: process.running, LOAD_TIMEOUT))
        yield Large(url, process, observed)
    finally:
        process.stop(grace=5)


Starter = Callable[..., Awaitable[str]]


@pytest.fixture
async def llama(tmp_path: Path) -> AsyncIterator[Starter]:
    """Start tiny-model llama-servers: ``await llama(save_dir, *extra)`` -> healthy URL."""
    # ``llama.stop(url)`` stops one sooner (a swap's unload); teardown stops the rest
    binary = _binary()
    model = tinymodel.ensure(MODELS, "tiny")
    started: dict[str, ManagedProcess] = {}

    async def start(save_dir: Path | None, *extra: str) -> str:
        port = free_port()
        process = ManagedProcess(_llama_args(binary, model, port, save_dir, *extra),
                                 tmp_path / f"llama-{len(started)}.log")
        url = f"http://{LOCALHOST}:{port}"
        started[url] = process.start()
        await _watch_start(url, lambda: process.running, LOAD_TIMEOUT)
        return url

    start.stop = lambda url: started[url].stop(grace=5)  # type: ignore[attr-defined]
    try:
        yield start
    finally:
        for process in started.values():
            process.stop(grace=5)


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Starter]:
    """Start 2-slot fake members like those llama-servers: ``await fake(save_dir, ...)``."""
    started: dict[str, UpstreamHandle] = {}

    async def start(save_dir: Path | None, *, cache_ram: int | None = None,
                    load_ms: float = 0, token_delay_ms: float = 0) -> str:
        # the fake reads these when it is built, as llama-server reads its flags
        if save_dir is None:
            monkeypatch.delenv(SLOT_SAVE_PATH_ENV, raising=False)
        else:
            monkeypatch.setenv(SLOT_SAVE_PATH_ENV, str(save_dir))
        if cache_ram is None:
            monkeypatch.delenv(CACHE_RAM_ENV, raising=False)
        else:
            monkeypatch.setenv(CACHE_RAM_ENV, str(cache_ram))
        handle = await start_upstream("fake", token_delay_ms=token_delay_ms, slots=2,
                                      load_ms=load_ms)
        started[handle.url] = handle
        return handle.url

    async def stop(url: str) -> None:
        await finish_within(started.pop(url).stop(), 15, "the fake member to stop")

    start.stop = stop  # type: ignore[attr-defined]
    try:
        yield start
    finally:
        for handle in started.values():
            await finish_within(handle.stop(), 15, f"fake member {handle.url} to stop")


async def _stop(starter: Starter, url: str) -> None:
    """Stop one member now, whichever kind (a swap's unload)."""
    result = starter.stop(url)  # type: ignore[attr-defined]
    if asyncio.iscoroutine(result):
        await result


def _dirs(tmp_path: Path) -> tuple[Path, Path]:
    """Separate save directories: the two servers' files have different formats."""
    real, fake = tmp_path / "real-slots", tmp_path / "fake-slots"
    real.mkdir()
    fake.mkdir()
    return real, fake


async def _post(http: aiohttp.ClientSession, url: str, body: Any = None,
                data: bytes | None = None) -> tuple[int, Any]:
    """(status, JSON body) of a POST with a JSON ``body`` (or raw ``data``)."""
    kwargs = {"data": data} if data is not None else {"json": body}
    async with http.post(url, timeout=aiohttp.ClientTimeout(total=STEP_TIMEOUT),
                         **kwargs) as resp:
        return resp.status, await resp.json(content_type=None)


async def _chat(http: aiohttp.ClientSession, url: str, messages: list[dict[str, str]],
                **extra: Any) -> dict[str, Any]:
    """A non-streamed chat completion's body (asserting a 200)."""
    status, body = await _post(http, f"{url}/v1/chat/completions",
                               {"messages": messages, "max_tokens": 4, **SAMPLING, **extra})
    assert status == 200, body
    return body


async def _events(http: aiohttp.ClientSession, url: str, path: str,
                  body: dict[str, Any]) -> tuple[str, list[Any]]:
    """A streamed completion: its content type and its events (JSON, then "[DONE]")."""
    events: list[Any] = []
    async with http.post(f"{url}{path}", json=body,
                         timeout=aiohttp.ClientTimeout(total=STEP_TIMEOUT)) as resp:
        assert resp.status == 200
        async for raw in resp.content:
            line = raw.decode().strip()
            if line.startswith("data: "):
                data = line[len("data: "):]
                events.append(data if data == "[DONE]" else json.loads(data))
        return resp.headers["Content-Type"], events


def _types(text: str) -> dict[str, str]:
    """Metric name -> type, from the ``# TYPE`` lines of an exposition."""
    return {parts[2]: parts[3] for line in text.splitlines()
            if len(parts := line.split()) == 4 and parts[:2] == ["#", "TYPE"]}


# ---- loading ---------------------------------------------------------------------------------

def _check_start(observed: Observed) -> None:
    """A start as llama.cpp's: every endpoint 503 ``Loading model`` until /health is 200."""
    healths = [row[2] for row in observed.rounds if row[2] is not None]
    assert (503, LOADING) in healths, observed.rounds  # a loading phase was seen
    assert healths[-1] == (200, {"status": "ok"})
    assert not _loading_violations(observed), observed.rounds
    for row in observed.rounds:
        for answer in row:
            assert answer is None or answer[0] == 200 or answer == (503, LOADING), row


async def test_health_is_503_while_loading_and_probes_answer_only_after_it(
        large: Large, fake: Starter) -> None:
    """/health, /slots and /metrics answer 503 while loading, and become ready together."""
    _check_start(large.start)
    # the fake's simulated load: it listens at once and answers as llama.cpp does meanwhile
    url = await fake(None, load_ms=1000)
    _check_start(await _watch_start(url, lambda: True, LOAD_TIMEOUT))


# ---- a running generation: idle probes, deferred slot actions --------------------------------

def _first_token(raw: bytes) -> bool:
    """An SSE line carrying generated content (llama.cpp's first chunk has the role alone)."""
    if not raw.startswith(b"data: ") or raw.strip() == b"data: [DONE]":
        return False
    choices = json.loads(raw[len(b"data: "):])["choices"]
    return bool(choices) and choices[0].get("delta", {}).get("content") is not None


async def _during_generation(url: str) -> dict[str, Any]:
    """Read every idle signal during a long generation on slot 0, and save that slot."""
    seen: dict[str, Any] = {}
    async with aiohttp.ClientSession() as http:
        seen["slot_count"] = await slot_count(f"{url}/slots", 5)
        stream = await http.post(f"{url}/v1/chat/completions", json={
            "messages": CONVERSATION, "stream": True, "max_tokens": 200, "id_slot": 0,
            **SAMPLING}, timeout=aiohttp.ClientTimeout(total=60))
        try:
            async with asyncio.timeout(STEP_TIMEOUT):
                async for raw in stream.content:  # the first token: generation is under way
                    if _first_token(raw):
                        break
            # 200 tokens take seconds on either server: it is still generating now
            seen["slots_probe"] = await probe_idle(http, f"{url}/slots", 5)
            seen["metric_probe"] = await run_probe(http, PROCESSING, url, 5)
            _, slots = await _get(http, f"{url}/slots")
            seen["busy_slots"] = [s["id"] for s in slots if s["is_processing"]]
            save = asyncio.ensure_future(_post(http, f"{url}/slots/0?action=save",
                                               {"filename": "busy.bin"}))

            async def deferred() -> bool:
                async with http.get(f"{url}/metrics") as resp:
                    return metric_sum(await resp.text(), "llamacpp:requests_deferred") == 1
            await _until(deferred, "the save counted as deferred")
            seen["save_waited"] = not save.done()
        finally:
            stream.close()  # the hang-up: both servers stop the generation
        seen["save"] = await asyncio.wait_for(save, STEP_TIMEOUT)

        async def idle() -> bool:
            return await probe_idle(http, f"{url}/slots", 5) is True
        await _until(idle, "idle after the hang-up")
        seen["metric_probe_after"] = await run_probe(http, PROCESSING, url, 5)
    return seen


async def test_a_running_generation_reads_busy_and_defers_slot_actions(
        large: Large, fake: Starter, tmp_path: Path) -> None:
    """Both idle probes read busy during a generation, idle after; a save there waits."""
    real = await _during_generation(large.url)
    fake_url = await fake(tmp_path, token_delay_ms=50)
    simulated = await _during_generation(fake_url)
    for seen in (real, simulated):
        assert seen["slot_count"] == 2
        assert seen["slots_probe"] is False and seen["metric_probe"] is False
        assert seen["busy_slots"] == [0]
        # a save of a busy slot waits for it (llama.cpp defers the task), it is not refused
        assert seen["save_waited"] is True
        status, body = seen["save"]
        assert status == 200 and body["id_slot"] == 0 and body["n_saved"] > 0, body
        assert seen["metric_probe_after"] is True
    assert set(real["save"][1]) == set(simulated["save"][1])


# ---- the slot API ------------------------------------------------------------------------------

async def _slot_api(url: str) -> dict[str, tuple[int, Any]]:
    """Every slot-API answer the service can meet (and the malformed ones), by case."""
    async with aiohttp.ClientSession() as http:
        await _chat(http, url, CONVERSATION, id_slot=0)
        answers = {
            "save": await _post(http, f"{url}/slots/0?action=save", {"filename": "s0.bin"}),
            "save_empty": await _post(http, f"{url}/slots/1?action=save",
                                      {"filename": "s1.bin"}),
            "restore": await _post(http, f"{url}/slots/1?action=restore",
                                   {"filename": "s0.bin"}),
            "restore_empty": await _post(http, f"{url}/slots/0?action=restore",
                                         {"filename": "s1.bin"}),
            # into the slot holding the restored cache: a failed restore leaves it empty
            "restore_missing": await _post(http, f"{url}/slots/1?action=restore",
                                           {"filename": "absent.bin"}),
            "erase": await _post(http, f"{url}/slots/1?action=erase", {}),
            "slot_not_a_number": await _post(http, f"{url}/slots/x?action=save",
                                             {"filename": "x.bin"}),
            "bad_action": await _post(http, f"{url}/slots/0?action=compact",
                                      {"filename": "x.bin"}),
            "no_action": await _post(http, f"{url}/slots/0", {"filename": "x.bin"}),
            "no_filename": await _post(http, f"{url}/slots/0?action=save", {}),
            "body_not_json": await _post(http, f"{url}/slots/0?action=restore", data=b"{x"),
        }
        for name in ("../x", "a/b", "", "trailing.", "a..b", "a:b"):
            answers[f"filename {name!r}"] = await _post(
                http, f"{url}/slots/0?action=save", {"filename": name})
        async with http.get(f"{url}/slots") as resp:
            answers["slots"] = resp.status, await resp.json()
    return answers


async def test_slot_api_answers_and_errors_agree(llama: Starter, fake: Starter,
                                                 tmp_path: Path) -> None:
    """Save, restore, erase and their errors: same status, fields, error types, messages."""
    real_dir, fake_dir = _dirs(tmp_path)
    real = await _slot_api(await llama(real_dir))
    simulated = await _slot_api(await fake(fake_dir))
    assert real.keys() == simulated.keys()
    for case in real:
        (status, body), (fake_status, fake_body) = real[case], simulated[case]
        assert fake_status == status, (case, body, fake_body)
        if status == 200 and case != "slots":
            # the answer's fields (slotcache.py reads n_saved / n_restored) and their timings
            assert set(fake_body) == set(body), (case, body, fake_body)
            if "timings" in body:
                assert set(fake_body["timings"]) == set(body["timings"]), case
        elif status != 200:
            assert fake_body["error"]["type"] == body["error"]["type"], (case, body, fake_body)
            assert fake_body["error"]["code"] == body["error"]["code"] == status
            if status == 400:  # their own words (a 500 quotes each one's JSON parser)
                assert fake_body["error"]["message"] == body["error"]["message"], case
    for answers in (real, simulated):
        assert answers["save"][1]["n_saved"] > 0 and answers["save_empty"][1]["n_saved"] == 0
        assert answers["restore"][1]["n_restored"] == answers["save"][1]["n_saved"]
        assert answers["restore_missing"][0] == 400  # slotcache.py: "no file", not a failure
        assert answers["erase"][1]["n_erased"] == 0
        assert answers["no_filename"][0] == answers["body_not_json"][0] == 500
        status, slots = answers["slots"]
        # what probe_idle, slot_count and carry read; the fake lists no field llama.cpp lacks
        assert status == 200 and [s["id"] for s in slots] == [0, 1]
        assert all(isinstance(s["is_processing"], bool) for s in slots)
    for real_slot, fake_slot in zip(real["slots"][1], simulated["slots"][1]):
        assert set(fake_slot) <= set(real_slot)


async def _without_save_path(url: str) -> dict[str, tuple[int, Any]]:
    """Every slot action on a server started without --slot-save-path, and carry's save."""
    async with aiohttp.ClientSession() as http:
        answers = {f"{action} {slot}": await _post(
            http, f"{url}/slots/{slot}?action={action}", {"filename": "x.bin"})
            for action in ("save", "restore", "erase") for slot in ("0", "x")}
        saved = await carry(http, f"{url}/slots", "save", lambda s: f"x{s}.bin")
        answers["carry"] = saved.ok, saved.detail
    return answers


async def test_slot_actions_without_a_save_path_are_501(llama: Starter, fake: Starter) -> None:
    """Without --slot-save-path every slot action is 501, and carry's save says so."""
    real = await _without_save_path(await llama(None))
    simulated = await _without_save_path(await fake(None))
    for answers in (real, simulated):
        for case, answer in answers.items():
            if case != "carry":
                # 501 before the slot id is even read, for every action, erase included
                assert answer[0] == 501 and answer[1]["error"]["type"] == "not_supported_error"
        ok, detail = answers["carry"]
        assert not ok and "501" in detail and "--slot-save-path" in detail
    assert real == simulated


# ---- carry-over across a restart -------------------------------------------------------------

async def _round_trip(starter: Starter, save_dir: Path) -> dict[str, Any]:
    """The service's carry-over: save, restart, restore, the conversation again; then cold."""
    def name(slot: int) -> str:
        return f"ns-m-model-slot{slot}.bin"
    seen: dict[str, Any] = {}
    async with aiohttp.ClientSession() as http:
        url = await starter(save_dir)
        seen["first"] = await _chat(http, url, CONVERSATION)
        seen["saved"] = await carry(http, f"{url}/slots", "save", name)
        await _stop(starter, url)
        url = await starter(save_dir)  # the member after a swap away and back
        seen["restored"] = await carry(http, f"{url}/slots", "restore", name)
        seen["warm"] = await _chat(http, url, CONVERSATION)
        await _stop(starter, url)
        url = await starter(save_dir)
        seen["missing"] = await carry(http, f"{url}/slots", "restore", lambda s: f"none{s}.bin")
        seen["cold"] = await _chat(http, url, CONVERSATION)
    return seen


async def test_carry_over_across_a_restart_agrees(llama: Starter, fake: Starter,
                                                  tmp_path: Path) -> None:
    """carry() saves and restores alike, and a restore makes the next prompt a full hit."""
    real_dir, fake_dir = _dirs(tmp_path)
    results = [await _round_trip(llama, real_dir), await _round_trip(fake, fake_dir)]
    for seen in results:
        saved, restored, missing = seen["saved"], seen["restored"], seen["missing"]
        assert saved.ok and saved.slots == 2 and saved.tokens > 0, saved
        assert restored.ok and restored.tokens == saved.tokens and restored.slots == 2, restored
        assert not missing.ok and "took no effect" in missing.detail
        assert "2 without a file" in missing.detail
        first, warm, cold = (seen[k]["timings"] for k in ("first", "warm", "cold"))
        prompt = seen["first"]["usage"]["prompt_tokens"]
        assert first["cache_n"] == 0 and first["prompt_n"] == prompt
        # restored: all but the last prompt token reused (llama.cpp evaluates that one again)
        assert warm["cache_n"] == prompt - 1 and warm["prompt_n"] == 1, warm
        assert cold["cache_n"] == 0 and cold["prompt_n"] == prompt, cold
        usage = seen["warm"]["usage"]
        assert usage["prompt_tokens"] == warm["cache_n"] + warm["prompt_n"]
        assert usage["prompt_tokens_details"] == {"cached_tokens": warm["cache_n"]}


# ---- in one process: the RAM prompt cache ------------------------------------------------------

async def _a_b_a(url: str) -> list[dict[str, Any]]:
    """A conversation on slot 0, another pushes it out, the first comes back: timings."""
    async with aiohttp.ClientSession() as http:
        return [(await _chat(http, url, messages, id_slot=0))["timings"]
                for messages in (CONVERSATION, OTHER, CONVERSATION)]


async def test_the_ram_prompt_cache_agrees(llama: Starter, fake: Starter) -> None:
    """In one process a prompt pushed out of its slot still hits, unless --cache-ram 0."""
    on = [await _a_b_a(await llama(None)), await _a_b_a(await fake(None))]
    off = [await _a_b_a(await llama(None, "--cache-ram", "0")),
           await _a_b_a(await fake(None, cache_ram=0))]
    for timings in on:
        # llama.cpp kept the pushed-out prompt in RAM: the returning one is a full hit
        assert timings[0]["cache_n"] == 0 and timings[2]["prompt_n"] == 1, timings
    for timings in off:
        # --cache-ram 0: only what the two prompts share is reused
        assert timings[2]["prompt_n"] > 1 and timings[2]["cache_n"] == timings[1]["cache_n"]


# ---- completions: timings, usage, streams ------------------------------------------------------

async def _completions(url: str) -> dict[str, Any]:
    """Chat and text completions, plain and streamed (chat also with include_usage)."""
    body = {"max_tokens": 5, **SAMPLING}
    chat = {"messages": CONVERSATION, **body}
    text = {"prompt": "the a and to", **body}
    # llama.cpp closes the connection after a stream without saying so (no Connection:
    # close): a reused one fails ("Can not write request body"), so each request gets its own
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        return {
            "chat": (await _post(http, f"{url}/v1/chat/completions", chat))[1],
            "text": (await _post(http, f"{url}/v1/completions", text))[1],
            "chat_stream": await _events(http, url, "/v1/chat/completions",
                                         {**chat, "stream": True}),
            "chat_stream_usage": await _events(http, url, "/v1/chat/completions", {
                **chat, "stream": True, "stream_options": {"include_usage": True}}),
            "text_stream": await _events(http, url, "/v1/completions", {**text, "stream": True}),
        }


def _check_completion(body: dict[str, Any], n: int) -> None:
    """One completion's usage agrees with its timings, as llama.cpp counts them."""
    usage, timings = body["usage"], body["timings"]
    assert usage["completion_tokens"] == timings["predicted_n"] == n
    assert usage["prompt_tokens"] == timings["cache_n"] + timings["prompt_n"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + n
    assert usage["prompt_tokens_details"] == {"cached_tokens": timings["cache_n"]}


async def test_completion_timings_and_usage_agree(llama: Starter, fake: Starter) -> None:
    """timings and usage: same keys, same arithmetic, in the same chunk of a stream."""
    real = await _completions(await llama(None))
    simulated = await _completions(await fake(None))
    for kind in ("chat", "text"):
        for answers in (real, simulated):
            _check_completion(answers[kind], 5)
        assert set(simulated[kind]["timings"]) == set(real[kind]["timings"])
        assert set(simulated[kind]["usage"]) == set(real[kind]["usage"])
        assert set(simulated[kind]) <= set(real[kind])  # no field a client would miss there
        assert simulated[kind]["object"] == real[kind]["object"]
    for kind in ("chat_stream", "chat_stream_usage", "text_stream"):
        (real_type, real_events), (fake_type, fake_events) = real[kind], simulated[kind]
        assert real_type.startswith("text/event-stream") and fake_type.startswith(
            "text/event-stream")
        for events in (real_events, fake_events):
            assert events[-1] == "[DONE]"
            last = events[-2]
            assert set(last["timings"]) == set(real_events[-2]["timings"]), kind
            if kind != "chat_stream":
                # the usage rides on the last chunk (with no choices, when asked for)
                _check_completion(last, 5)
                assert (last["choices"] == []) is (kind == "chat_stream_usage")
            else:
                assert "usage" not in last and last["choices"][0]["finish_reason"]
        assert {e["object"] for e in fake_events[:-1]} == {e["object"] for e in real_events[:-1]}


# ---- /metrics ----------------------------------------------------------------------------------

async def _metrics(url: str) -> tuple[str, str, bool | None]:
    """The /metrics content type and text after one completion, and the metric probe."""
    async with aiohttp.ClientSession() as http:
        await _chat(http, url, CONVERSATION)
        async with http.get(f"{url}/metrics") as resp:
            assert resp.status == 200
            kind, text = resp.headers["Content-Type"], await resp.text()
        return kind, text, await run_probe(http, PROCESSING, url, 5)


async def test_metric_names_and_types_agree(llama: Starter, fake: Starter) -> None:
    """The same llamacpp:* names and types, and the idle-metric probe reads both alike."""
    real = await _metrics(await llama(None))
    simulated = await _metrics(await fake(None))
    assert _types(simulated[1]) == _types(real[1])
    assert _types(real[1])["llamacpp:requests_processing"] == "gauge"
    for kind, text, idle in (real, simulated):
        assert kind.startswith("text/plain; version=0.0.4")
        assert idle is True  # the idle-metric probe reads it, and it reads idle
        assert metric_sum(text, "llamacpp:requests_deferred") == 0
        assert metric_sum(text, "llamacpp:tokens_predicted_total") == 4
        assert metric_sum(text, "llamacpp:prompt_tokens_total") > 0
