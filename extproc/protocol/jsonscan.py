"""Reading the top-level ``model`` of a JSON request body without building the document.

``json.loads`` on a 24 MiB body of small values (``[{},{},...]``) builds millions of objects:
about 27 times the body in memory and most of a second with the event loop stopped. Bodies
up to ``LOADS_LIMIT`` still go to ``json.loads`` (faster, and small); larger ones are walked
by this scanner instead. It validates the whole body as JSON (the same answers as a full
parse: malformed anywhere, trailing data, nesting too deep), keeps a stack of open brackets
and the last top-level ``model``, reads copies of an array element and runs of small values
at C speed (memory compares, one regular expression per window), and hands the event loop
back every thousand tokens or window of a long string.

Duplicate top-level ``model`` keys: the last one wins, as with ``json.loads`` (and the
Python model servers behind us), so the member reads the model we routed on.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import re
from collections.abc import Generator
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

# Deeper nesting is refused as invalid JSON (json.loads refused it at about the interpreter's
# recursion limit); requests nest a few levels, tool schemas a few dozen at most.
MAX_DEPTH = 512
# The scanner hands control back after about this many tokens (a few milliseconds of work).
STEP_TOKENS = 1_000
# Bodies up to this size are parsed whole with json.loads: faster than the scanner (the hot
# path's bodies are a few KB), and at most about 27 times this much memory, briefly.
LOADS_LIMIT = 256 * 1024
# Runs of identical array elements up to this long are skipped this many bytes at a time.
_UNIT, _BLOCK = 64, 64 * 1024
# Runs of small values (numbers, literals, strings without escapes, and arrays or objects of
# those up to two levels deep) in an array, or of members with such values in an object, are
# read by one regular expression over at most this many bytes at a time; a member named
# "model" stops an object's run.
_WINDOW = 64 * 1024
_W = rb"[ \t\n\r]*"
_SCALAR = (rb'(?:-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null'
           rb'|"[^"\\\t\n\r]*")')


def _nested(value: bytes) -> bytes:
    """A pattern for ``value`` or an array or object of such values (one level deeper)."""
    member = rb'"[^"\\\t\n\r]*"' + _W + rb":" + _W + value + _W
    return (rb"(?:" + _SCALAR + rb"|\[" + _W + rb"(?:" + value + _W + rb"(?:," + _W + value + _W
            + rb")*+)?\]|\{" + _W + rb"(?:" + member + rb"(?:," + _W + member + rb")*+)?\})")


_SMALL = _W + _nested(_nested(_SCALAR)) + _W + rb","  # (values nested up to two levels)
# (possessive: sre keeps no backtracking state per repetition)
_ARRAY_RUN = re.compile(rb"(?:" + _SMALL + rb")*+")
_OBJECT_RUN = re.compile(rb'(?:' + _W + rb'(?!"model")"[^"\\\t\n\r]*"' + _W + rb":" + _SMALL
                         + rb")*+")
# The pre-pass (UTF-8 and control characters) works in slices of this many bytes.
_SLICE = 256 * 1024
_WS = b" \t\n\r"
_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_SIMPLE_ESCAPES = (b'\\"', b"\\/", b"\\b", b"\\f", b"\\n", b"\\r", b"\\t")
_BAD_UNICODE = re.compile(rb"\\u(?![0-9a-fA-F]{4})")
_BACKSLASH = ord("\\")
_LITERALS = {ord("t"): b"true", ord("f"): b"false", ord("n"): b"null", ord("N"): b"NaN",
             ord("I"): b"Infinity"}
# Every byte but the C0 controls: deleting them leaves only the controls a body holds.
_NOT_CONTROL = bytes(range(0x20, 0x100))
_TYPE_OF = {ord("{"): "dict", ord("["): "list", ord('"'): "str", ord("t"): "bool",
            ord("f"): "bool", ord("n"): "NoneType"}
_LBRACE, _LBRACKET, _RBRACE, _QUOTE, _COMMA, _COLON = (ord(c) for c in '{[}",:')
_CLOSE = {_LBRACE: _RBRACE, _LBRACKET: ord("]")}


class ScanError(ValueError):
    """The body is not valid JSON (or not UTF-8); the message says where."""


@dataclass(slots=True)
class Scanned:
    """What a scan found: whether the body is one JSON object, and its top-level model.

    ``model`` is the decoded string, or None; ``model_type`` names the value's Python type
    as ``json.loads`` would have built it ("" when there is no top-level model key).
    """

    is_object: bool = False
    model: str | None = None
    model_type: str = ""
    model_length: int = 0  # the raw value's length in bytes (a string too long to decode)


def scan(body: bytes, max_model_bytes: int) -> Generator[None, None, Scanned]:
    """Validate ``body`` as JSON and find its top-level ``model``; a generator that yields
    now and then (drive it with ``run`` or ``run_async``) and returns what it found.

    A model value longer than ``max_model_bytes`` is reported by its length, not decoded.
    """
    if len(body) <= LOADS_LIMIT:
        return _loaded(body)
    return (yield from _scanned(body, max_model_bytes))


def _loaded(body: bytes) -> Scanned:
    """What ``scan`` finds, by parsing the (small) body whole."""
    try:
        # Decode strictly first: json.loads(bytes) would also accept UTF-16/32 and lone
        # surrogates, which RFC 8259 forbids and the member may choke on.
        document = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ScanError(f"not valid UTF-8: {exc.reason} at byte {exc.start}") from None
    except (ValueError, RecursionError) as exc:
        raise ScanError(str(exc)) from None
    found = Scanned(is_object=isinstance(document, dict))
    if found.is_object and "model" in document:
        model = document["model"]
        found.model_type = type(model).__name__
        if isinstance(model, str):
            found.model, found.model_length = model, len(model)
    return found


def _scanned(body: bytes, max_model_bytes: int) -> Generator[None, None, Scanned]:
    """What ``scan`` finds, by walking the (large) body without building it."""
    spaced = yield from _prepass(body)
    found = Scanned()
    n = len(body)
    i = _skip_ws(body, 0)
    if i < n and body[i] == _LBRACE:
        found.is_object = True
    stack: list[int] = []  # the open brackets, innermost last
    expect_key = False  # inside an object, at a key (after "{" or ",")
    model_key = False  # the value about to be read is the top-level model's
    element = -1  # in an array: where the current element began (just past its comma)
    elements: list[int] = []  # the same for each array (or object) the stack holds
    tokens = 0
    try:
        while True:
            tokens += 1
            if tokens >= STEP_TOKENS:
                tokens = 0
                yield
            # ---- a value (or, in an object, a key) starts at i
            c = body[i]
            if expect_key:
                if c != _QUOTE:
                    raise ScanError(f"expected a string key at byte {i}")
                end = _string_end(body, i, spaced)
                if end < 0:
                    end = yield from _long_string_end(body, i, spaced)
                if len(stack) == 1:
                    model_key = _is_model(body, i, end)
                i = end
                if body[i] in _WS:
                    i = _skip_ws(body, i)
                if body[i] != _COLON:
                    raise ScanError(f"expected ':' at byte {i}")
                i += 1
                if body[i] in _WS:
                    i = _skip_ws(body, i)
                expect_key = False
                continue
            if c == _LBRACE or c == _LBRACKET:
                if model_key:
                    found.model, found.model_type, model_key = None, _TYPE_OF[c], False
                if len(stack) >= MAX_DEPTH:
                    raise ScanError(f"nested more than {MAX_DEPTH} deep at byte {i}")
                close = _CLOSE[c]
                i += 1
                if body[i] in _WS:
                    i = _skip_ws(body, i)
                if body[i] == close:
                    i += 1
                else:
                    stack.append(close)
                    elements.append(element)
                    expect_key = c == _LBRACE
                    element = -1
                    continue
            elif c == _QUOTE:
                end = _string_end(body, i, spaced)
                if end < 0:
                    end = yield from _long_string_end(body, i, spaced)
                if model_key:
                    _take_model(found, body, i, end, max_model_bytes)
                    model_key = False
                i = end
            else:
                end = _scalar_end(body, i)
                if model_key:
                    found.model, found.model_type = None, _TYPE_OF.get(c) or (
                        "int" if body[i:end].lstrip(b"-").isdigit() else "float")
                    model_key = False
                i = end
            # ---- after a value: a comma, the end of its container, or the end of the body
            while True:
                if i < n and body[i] in _WS:
                    i = _skip_ws(body, i)
                if not stack:
                    if i != n:
                        raise ScanError(f"extra data at byte {i}")
                    return found
                c = body[i]
                if c == _COMMA:
                    i += 1
                    if stack[-1] == _RBRACE:
                        expect_key = True
                        run = _run_end(_OBJECT_RUN, body, i)
                    else:
                        if element >= 0:
                            i = _repeats(body, element, i)
                        run = _run_end(_ARRAY_RUN, body, i)
                        element = run
                    tokens += (run - i) >> 4
                    i = run
                    if body[i] in _WS:
                        i = _skip_ws(body, i)
                    break
                if c != stack[-1]:
                    raise ScanError(f"expected ',' or {chr(stack[-1])!r} at byte {i}")
                stack.pop()
                element = elements.pop()
                i += 1
    except IndexError:
        raise ScanError(f"unexpected end of body at byte {n}") from None


def _repeats(body: bytes, element: int, i: int) -> int:
    """Past the copies that follow at ``i`` of the array element (with its comma) that
    began at ``element``: a copy of an element already read is valid JSON too, so a run of
    identical small values (``{},{},...``) is skipped at memory-compare speed."""
    unit = body[element:i]
    if len(unit) > _UNIT or not body.startswith(unit, i):
        return i
    block = unit * (_BLOCK // len(unit))
    while body.startswith(block, i):
        i += len(block)
    while body.startswith(unit, i):
        i += len(unit)
    return i


async def run_async(scanning: Generator[None, None, T]) -> T:
    """Drive a scan to its end, letting the event loop run each time it yields."""
    try:
        while True:
            next(scanning)
            await asyncio.sleep(0)
    except StopIteration as done:
        return done.value


def _prepass(body: bytes) -> Generator[None, None, bool]:
    """Refuse what is not UTF-8 or holds a raw control character other than JSON's
    whitespace (invalid inside a string and outside one alike), a slice at a time.
    Returns whether the body holds tabs or line breaks (which strings must then be
    checked for)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    spaced = False
    for start in range(0, len(body), _SLICE):
        piece = body[start:start + _SLICE]
        if not piece.isascii():
            try:
                decoder.decode(piece, final=start + _SLICE >= len(body))
            except UnicodeDecodeError as exc:
                raise ScanError(f"not valid UTF-8: {exc.reason} near byte "
                                f"{start + exc.start}") from None
        controls = piece.translate(None, _NOT_CONTROL)
        if controls:
            if controls.strip(_WS):
                at = piece.find(controls.strip(_WS)[:1])
                raise ScanError(f"control character at byte {start + at}")
            spaced = True
        yield
    return spaced


def _run_end(run: re.Pattern[bytes], body: bytes, i: int) -> int:
    """Where a run of small values starting at ``i`` ends (its pattern matches the empty run)."""
    match = run.match(body, i, i + _WINDOW)
    return match.end() if match else i


def _skip_ws(body: bytes, i: int) -> int:
    """The first byte at or after ``i`` that is not whitespace."""
    n = len(body)
    while i < n and body[i] in _WS:
        i += 1
    return i


def _string_end(body: bytes, i: int, spaced: bool) -> int:
    """Just past the string starting at ``i`` (its quote), its escapes checked; ``spaced``:
    the body holds tabs or line breaks, which a string may not. -1 for a string this does
    not read at once: longer than a window, or holding an escaped quote."""
    j = body.find(b'"', i + 1)
    if j < 0:
        raise ScanError(f"unterminated string starting at byte {i}")
    if body[j - 1] == _BACKSLASH or j - i > _WINDOW:
        return -1
    inner = body[i + 1:j]
    if _BACKSLASH in inner:
        _check_escapes(inner.replace(b"\\\\", b"\0\0"), i)
    if spaced:
        _check_spaces(inner, i)
    return j + 1


def _long_string_end(body: bytes, i: int, spaced: bool) -> Generator[None, None, int]:
    """``_string_end`` for any string, a window at a time (yielding between windows)."""
    pos = i + 1
    while True:
        window = body[pos:pos + _WINDOW]
        if not window:
            raise ScanError(f"unterminated string starting at byte {i}")
        # pairs of backslashes are whole escapes: blanked, every backslash left starts one
        window = window.replace(b"\\\\", b"\0\0")
        cut = window.rfind(b"\\", max(0, len(window) - 6))
        if cut >= 0 and pos + len(window) < len(body):
            window = window[:cut]  # an escape the window would split: the next one reads it
        close = window.replace(b'\\"', b"\0\0").find(b'"')
        part = window if close < 0 else window[:close]
        _check_escapes(part, i)
        if spaced:
            _check_spaces(part, i)
        if close >= 0:
            return pos + close + 1
        pos += len(window)
        yield


def _check_escapes(inner: bytes, start: int) -> None:
    """Refuse a string (its content, pairs of backslashes blanked) with an invalid escape."""
    if _BACKSLASH not in inner:
        return
    for escape in _SIMPLE_ESCAPES:  # blanked, not removed: no new escape can form
        inner = inner.replace(escape, b"\0\0")
    if inner.count(b"\\") != inner.count(b"\\u") or _BAD_UNICODE.search(inner):
        raise ScanError(f"invalid escape in the string starting at byte {start}")


def _check_spaces(inner: bytes, start: int) -> None:
    """Refuse a string holding a raw tab or line break."""
    if b"\t" in inner or b"\n" in inner or b"\r" in inner:
        raise ScanError(f"control character in the string starting at byte {start}")


def _scalar_end(body: bytes, i: int) -> int:
    """Just past the number or literal starting at ``i``."""
    c = body[i]
    if c == b"-"[0] and body.startswith(b"-Infinity", i):
        return i + 9
    literal = _LITERALS.get(c)
    if literal is not None:
        if not body.startswith(literal, i):
            raise ScanError(f"invalid literal at byte {i}")
        return i + len(literal)
    match = _NUMBER.match(body, i)
    if match is None:
        raise ScanError(f"expected a value at byte {i}")
    return match.end()


def _is_model(body: bytes, start: int, end: int) -> bool:
    """Whether the key body[start:end] (with its quotes) reads "model", escapes decoded."""
    if end - start == 7:
        return body[start:end] == b'"model"'
    # "model" spelled with \\u escapes is at most 5 * 6 + 2 bytes
    return end - start <= 32 and json.loads(body[start:end]) == "model"


def _take_model(found: Scanned, body: bytes, start: int, end: int, limit: int) -> None:
    """Record the top-level model string body[start:end], decoded unless too long."""
    found.model_type = "str"
    found.model_length = end - start - 2
    found.model = json.loads(body[start:end]) if end - start - 2 <= limit else None
