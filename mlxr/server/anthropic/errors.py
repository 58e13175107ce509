"""Anthropic's error shape on its routes: {"type": "error", "error": {"type", "message"}}, the
type chosen by status as Anthropic's are."""
from __future__ import annotations

from typing import Any

ROUTE = "/v1/messages"
_BY_STATUS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
              404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
              503: "overloaded_error", 529: "overloaded_error"}


def is_anthropic_path(path: str) -> bool:
    return path == ROUTE or path.startswith(ROUTE + "/")


def error_type(status: int) -> str:
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(status), "message": message}}
