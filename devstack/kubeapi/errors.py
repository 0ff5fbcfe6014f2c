"""API failures, each answered as a meta/v1 Status object the way the real API server words it."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A Kubernetes API failure with its HTTP code, machine-readable reason and message."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}

    def status(self) -> dict[str, Any]:
        """The Status object the API server sends as the response body or watch ERROR event."""
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def _details(display: str, kind: str, name: str | None) -> dict[str, Any]:
    group = display.split(".", 1)[1] if "." in display else ""
    return {k: v for k, v in {"name": name, "group": group, "kind": kind}.items() if v}


def not_found(display: str, kind: str, name: str) -> ApiError:
    """404 for a missing object; `display` is the plural, dotted with the group for non-core."""
    return ApiError(404, "NotFound", f'{display} "{name}" not found', _details(display, kind, name))


def no_such_path() -> ApiError:
    """404 for a URL that names no served resource."""
    return ApiError(404, "NotFound", "the server could not find the requested resource")


def already_exists(display: str, kind: str, name: str) -> ApiError:
    """409 for a create whose name is taken."""
    return ApiError(409, "AlreadyExists", f'{display} "{name}" already exists', _details(display, kind, name))


def conflict(display: str, kind: str, name: str, why: str | None = None) -> ApiError:
    """409 for a write that carries a stale resourceVersion (or an injected fault)."""
    why = why or "the object has been modified; please apply your changes to the latest version and try again"
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {display} "{name}": {why}',
                    _details(display, kind, name))


def gone(requested: int, oldest: int) -> ApiError:
    """410 for a resourceVersion older than the compacted event history."""
    return ApiError(410, "Expired", f"too old resource version: {requested} ({oldest})")


def invalid(display: str, kind: str, name: str, what: str) -> ApiError:
    """422 for an object the server refuses as written."""
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {what}', _details(display, kind, name))


def bad_request(message: str) -> ApiError:
    """400 for a malformed request."""
    return ApiError(400, "BadRequest", message)


def unsupported_media(content_type: str) -> ApiError:
    """415 for a patch type the server does not implement."""
    return ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {content_type}")


def method_not_allowed(verb: str) -> ApiError:
    """405 for a verb the resource does not support here."""
    return ApiError(405, "MethodNotAllowed",
                    f"the server does not allow this method on the requested resource ({verb})")


def unavailable() -> ApiError:
    """503 while the emulator plays an unreachable API server."""
    return ApiError(503, "ServiceUnavailable", "the API server is unavailable (emulated outage)")


def too_many_requests() -> ApiError:
    """429 as API Priority and Fairness answers a request its priority level has no seat for."""
    return ApiError(429, "TooManyRequests", "Too many requests, please try again later.",
                    {"retryAfterSeconds": 1})
