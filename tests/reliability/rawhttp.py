"""A raw HTTP/1.x client for hostile requests that ordinary clients refuse to send."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field


@dataclass
class RawResponse:
    """Status, lower-cased headers (last value wins) and the body read until close."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


def build_request(method: str, path: str, body: bytes, headers: list[tuple[str, str]],
                  *, version: str = "HTTP/1.1", framing: str = "length",
                  chunk_size: int = 7, trailers: tuple[tuple[str, str], ...] = ()) -> bytes:
    """Serialize a request; framing is ``length``, ``chunked`` (with optional trailers) or
    ``none`` (no body header)."""
    lines = [f"{method} {path} {version}", "host: 127.0.0.1", "connection: close"]
    lines += [f"{k}: {v}" for k, v in headers]
    if framing == "length":
        lines.append(f"content-length: {len(body)}")
        payload = body
    elif framing == "chunked":
        lines.append("transfer-encoding: chunked")
        payload = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + chunk_size]),
                                              body[i:i + chunk_size])
                           for i in range(0, len(body), chunk_size)) + b"0\r\n" + \
            "".join(f"{k}: {v}\r\n" for k, v in trailers).encode("latin-1") + b"\r\n"
    else:
        payload = body
    return "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + payload


async def send(port: int, raw: bytes, *, timeout: float = 10.0) -> RawResponse:
    """Send raw bytes to 127.0.0.1:port and parse the one response that comes back."""
    reply = await exchange(port, raw, timeout=timeout)
    if reply is None:
        raise ConnectionResetError("the connection ended before any answer")
    return reply


async def exchange(port: int, raw: bytes, *, timeout: float = 10.0) -> RawResponse | None:
    """Send raw bytes while reading the answer (None: the connection ended before any).

    Written concurrently with the read: Envoy may answer (413, 431) and close before a large
    request is fully sent, and that answer is what the caller wants. What came before a reset
    counts: a server that answers early ends with a reset once its delayed close is over
    (Envoy: 1 s) with our unsent body still arriving, and on a busy machine that can come
    after its answer was read (curl prints the answer too)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def upload() -> None:
        with contextlib.suppress(ConnectionError):
            writer.write(raw)
            await writer.drain()

    async def download() -> bytes:
        data = bytearray()
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65536):
                data += chunk
        return bytes(data)

    sending = asyncio.create_task(upload())
    try:
        data = await asyncio.wait_for(download(), timeout)
    finally:
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        writer.close()
    return parse(data) if data else None


def parse(data: bytes) -> RawResponse:
    """Parse a response whose body is framed by content-length, chunking or the close."""
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise ValueError(f"not an HTTP response: {data[:200]!r}")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        rest = _dechunk(rest)
    elif "content-length" in headers:
        rest = rest[:int(headers["content-length"])]
    return RawResponse(int(parts[1]), headers, rest)


def _dechunk(data: bytes) -> bytes:
    out = []
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out.append(data[:size])
        data = data[size + 2:]
    return b"".join(out)
