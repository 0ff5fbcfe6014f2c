"""Structured logging: one JSON object per line, with pool, member and request id fields.

Use ``log = get_logger(__name__)`` then ``log.info("swap started", pool=..., member=...)``;
keyword fields become top-level JSON keys.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any


class JsonFormatter(logging.Formatter):
    """Formats a record as a single JSON line."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON: time, level, logger, message, fields."""
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            entry.update(fields)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, separators=(",", ":"))


class StructuredLogger:
    """A thin wrapper that turns keyword arguments into JSON fields."""

    __slots__ = ("_logger",)

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger

    def _log(self, level: int, msg: str, exc_info: bool, fields: dict[str, Any]) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(level, msg, exc_info=exc_info, extra={"fields": fields},
                             stacklevel=3)

    def debug(self, msg: str, **fields: Any) -> None:
        """Log at debug level."""
        self._log(logging.DEBUG, msg, False, fields)

    def info(self, msg: str, **fields: Any) -> None:
        """Log at info level."""
        self._log(logging.INFO, msg, False, fields)

    def warning(self, msg: str, **fields: Any) -> None:
        """Log at warning level."""
        self._log(logging.WARNING, msg, False, fields)

    def error(self, msg: str, exc_info: bool = False, **fields: Any) -> None:
        """Log at error level, optionally with the current exception."""
        self._log(logging.ERROR, msg, exc_info, fields)


class Throttled:
    """One warning per ``every`` seconds at most, saying how many like it were held back:
    what a peer can make happen per request must not become a line per request (a flood of
    bad frames or messages would otherwise turn the log into the attack's amplifier)."""

    __slots__ = ("_log", "_msg", "_every", "_next", "_held", "_clock")

    def __init__(self, log: StructuredLogger, msg: str, every: float = 10.0,
                 clock: Any = time.monotonic) -> None:
        self._log, self._msg, self._every, self._clock = log, msg, every, clock
        self._next = 0.0
        self._held = 0

    def warning(self, **fields: Any) -> None:
        """Log the warning now, or count it for the next line."""
        now = self._clock()
        if now < self._next:
            self._held += 1
            return
        self._next = now + self._every
        held, self._held = self._held, 0
        self._log.warning(self._msg, held_back=held, **fields)


def get_logger(name: str) -> StructuredLogger:
    """Return the structured logger for a module."""
    return StructuredLogger(logging.getLogger(name))


def configure(level: str = "info", stream: Any = None) -> None:
    """Send every log record to ``stream`` (stderr) as JSON lines at ``level``."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp and grpc chatter is not ours to narrate at info level.
    for noisy in ("aiohttp.access", "grpc._cython", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
