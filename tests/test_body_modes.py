"""Request bodies in every body mode the service claims, through a real Envoy, in both modes.

Each Envoy (one per module-scoped config: the service's mode, the ext_proc filter's request
body mode, the listener's per-connection buffer limit: the inference extension chart's 32 KiB
or Envoy's default 1 MiB) serves every size and framing: 30 kB to 5 MB, with a content-length
or chunked with a trailer. Each request must be routed by its body's ``model`` to that
member, or, where Envoy's design makes that impossible, answered at once with an OpenAI-style
JSON error saying why: never left hanging.
"""

from __future__ import annotations

from pathlib import Path
from typing import AsyncIterator

import pytest
import pytest_asyncio

from tests.bodymodes import DEFAULT_LIMIT, GATEWAY_LIMIT, BodyStack, Config, start

pytestmark = [pytest.mark.envoy, pytest.mark.asyncio(loop_scope="module")]

CONFIGS = [Config(picker, mode, limit)
           for picker, modes in ((False, ("BUFFERED", "STREAMED")),
                                 (True, ("BUFFERED", "STREAMED", "FULL_DUPLEX_STREAMED")))
           for mode in modes for limit in (GATEWAY_LIMIT, DEFAULT_LIMIT)]
SIZES = [30_000, 100_000, 1_000_000, 5_000_000]


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=CONFIGS,
                        ids=[c.id for c in CONFIGS])
async def stack(request: pytest.FixtureRequest, envoy_bin: Path,
                tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[BodyStack]:
    """One Envoy per config, shared by every size and framing."""
    async for started in start(request.param, tmp_path_factory.mktemp(request.param.id)):
        yield started


def expected(config: Config, size: int, trailers: bool) -> tuple[int, str]:
    """(status, the member that serves it or the error code) for one cell (measured, Envoy 1.40).

    Where Envoy cannot hand the service a body it can route on, the answer is immediate:
    BUFFERED over the buffer limit, Envoy's 413; STREAMED behind the picker, Envoy forwards
    the headers with their answer unless it already holds the whole body, so a larger body
    with a content-length gets our 413 up front and a chunked one Envoy's own 503 (its router
    has no destination); STREAMED with trailers in several chunks, our 400 on the trailers
    (Envoy would forward twice the content-length past envoy.yaml's buffer filter).
    """
    fits = size < config.limit
    if config.body_mode == "FULL_DUPLEX_STREAMED" or fits:
        return 200, ""
    if config.body_mode == "BUFFERED":
        # headers skipped (one-message mode): the buffer filter raised the limit to 32 MiB
        if not config.picker and not trailers:
            return 200, ""
        return 413, "payload_too_large" if not config.picker else "Payload Too Large"
    if not config.picker:
        return (400, "streamed_body_with_trailers") if trailers else (200, "")
    return (503, "no healthy upstream") if trailers else (413, "streamed_body_too_large")


@pytest.mark.parametrize("trailers", [False, True], ids=["length", "trailers"])
@pytest.mark.parametrize("size", SIZES, ids=[f"{s // 1000}kB" for s in SIZES])
async def test_a_body_is_routed_by_its_model_or_refused_at_once(
        stack: BodyStack, size: int, trailers: bool) -> None:
    model = "coder" if trailers else "judge"  # every switch of framing is a swap
    outcome = await stack.post(model, size, trailers)
    status, code = expected(stack.config, size, trailers)
    if status == 200:
        assert (outcome.status, outcome.served_by) == (200, model), str(outcome)
    else:
        assert (outcome.status, outcome.code) == (status, code), str(outcome)
        assert outcome.seconds < 2.0, str(outcome)  # at once, not after a timeout
