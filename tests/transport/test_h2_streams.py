"""Streams one connection may keep, and memory given back once a crowd of them has gone
(extproc/transport/trim.py, listener.py). Counted in streams, refusals and calls, never in
time or bytes of memory (those are `make bench`'s, part 8)."""

from __future__ import annotations

from test_h2_connection import headers_frame
from test_h2_server import Factory, Frames, serve, settle

from extproc.settings import Settings
from extproc.transport import frames as f
from extproc.transport import listener
from extproc.transport.connection import UNACKED_STREAMS, ServerConnection
from extproc.transport.h2events import Request
from extproc.transport.trim import Trimmer

__all__ = ["serve"]  # the fixture, shared with test_h2_server


def test_the_stream_limit_is_hundreds_as_envoy_needs() -> None:
    # Envoy's pool opens another connection at the advertised limit: hundreds per connection
    # is enough for any number held, and bounds what one connection pins
    assert 100 <= Settings().max_streams_per_connection <= 1000


async def test_streams_past_the_limit_are_refused(serve: Factory) -> None:
    served = await serve(max_concurrent_streams=50)
    raw = await Frames.open(served.port)
    for sid in range(1, 2 * 200, 2):  # 200 streams asked, kept open
        raw.request(sid, b"held")
    refused = f.REFUSED_STREAM.to_bytes(4, "big")
    frames = await raw.until(lambda fs: sum(k == f.RST_STREAM and p == refused
                                            for k, _fl, _s, p in fs) == 150)
    assert min(s for k, _fl, s, p in frames if k == f.RST_STREAM) == 2 * 50 + 1
    assert await settle(lambda: served.server.live_calls == 50)
    raw.writer.close()
    assert await settle(lambda: served.server.live_calls == 0)


def test_memory_is_given_back_once_calls_fall_far_from_their_peak() -> None:
    trimmer = Trimmer(released=100)
    assert [trimmer.look(n) for n in (0, 50, 150, 120, 60)] == [False] * 5
    assert trimmer.look(49)  # 101 fewer than the peak of 150
    assert not trimmer.look(0)  # the peak starts again from 49
    assert [trimmer.look(n) for n in (500, 400)] == [False, True]


async def test_the_server_gives_memory_back_after_a_crowd_of_calls(
        serve: Factory, monkeypatch: object) -> None:
    gave: list[int] = []
    seen: list[int] = []

    class Seeing(Trimmer):
        def look(self, running: int) -> bool:
            seen.append(running)
            return super().look(running)
    monkeypatch.setattr(listener, "LOOK_EVERY", 0.05)  # type: ignore[attr-defined]
    monkeypatch.setattr(listener, "give_back",  # type: ignore[attr-defined]
                        lambda run, trim: gave.append(1))
    monkeypatch.setattr(listener, "Trimmer", lambda: Seeing(released=20))  # type: ignore
    served = await serve()
    raw = await Frames.open(served.port)
    for sid in range(1, 2 * 30, 2):
        raw.request(sid, b"held")
    assert await settle(lambda: served.server.live_calls == 30)
    assert await settle(lambda: 30 in seen)  # a look saw the peak
    assert not gave
    raw.writer.close()  # the calls are cut
    assert await settle(lambda: served.server.live_calls == 0)
    assert await settle(lambda: bool(gave))
    assert len(gave) == 1  # once per fall


def test_streams_past_the_limit_are_taken_until_our_settings_are_acknowledged() -> None:
    # Envoy sends what its pool holds pending on a new connection at once, before it has read
    # our SETTINGS: refusing those would fail its requests
    server = ServerConnection(max_concurrent_streams=2)
    server.receive(f.PREFACE + f.settings({}))
    burst = b"".join(headers_frame(sid, end=False) for sid in range(1, 2 * 6, 2))
    assert [type(e) for e in server.receive(burst)] == [Request] * 6
    server.receive(f.frame(f.SETTINGS, f.ACK, 0))  # it knows the limit now
    assert server.receive(headers_frame(13, end=False)) == []
    assert server.open_streams == 6 and not server.closed


def test_before_the_acknowledgement_streams_are_bounded_too() -> None:
    server = ServerConnection(max_concurrent_streams=2)
    server.receive(f.PREFACE + f.settings({}))
    burst = b"".join(headers_frame(sid, end=False)
                     for sid in range(1, 2 * (UNACKED_STREAMS + 10), 2))
    events = server.receive(burst)
    assert len(events) == UNACKED_STREAMS and server.open_streams == UNACKED_STREAMS
