"""keep_alive values, nanosecond durations and RFC 3339 timestamps as Ollama writes them."""
from __future__ import annotations

import math
import re
import time
from datetime import datetime, timezone

from mlxr.errors import InvalidParameterError

FOREVER = -1.0
# Longer than this is forever: an expiry past year 9999 cannot be written as a date.
MAX_KEEP_ALIVE_S = 100 * 365.25 * 86400
_UNITS_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
# Ollama reports "forever" as a far-future expiry; clients parse it as a date.
_FOREVER_TEXT = "9999-12-31T23:59:59Z"


def parse_keep_alive(value: float | int | str | None, field: str = "keep_alive") -> float | None:
    """Seconds to keep the model loaded: None = the server default, 0 = unload after the
    request, negative = forever (returned as -1). Numbers are seconds; strings are Go
    durations ("5m", "1h30m", "10s", "-1m") or plain numbers of seconds."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise InvalidParameterError(field, "must be a duration such as \"5m\" or a number of seconds")
    if isinstance(value, (int, float)):
        return _seconds(float(value), field)
    return _seconds(_parse_text(value.strip(), field), field)


def _seconds(value: float, field: str) -> float:
    if not math.isfinite(value):
        raise InvalidParameterError(field, "must be finite")
    return FOREVER if value < 0 or value > MAX_KEEP_ALIVE_S else value


def _parse_text(text: str, field: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    sign, body = (-1.0, text[1:]) if text.startswith("-") else (1.0, text.lstrip("+"))
    total, pos = 0.0, 0
    for match in _PART.finditer(body):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS_S[match.group(2)]
        pos = match.end()
    if not body or pos != len(body):
        raise InvalidParameterError(field, f"{text!r} is not a duration such as \"5m\", \"1h30m\" or \"10s\"")
    return sign * total


def ns(seconds: float) -> int:
    """Seconds -> whole nanoseconds (Ollama's unit for every duration)."""
    return max(0, int(round(seconds * 1e9)))


def rfc3339(epoch_s: float | None = None) -> str:
    """UTC time with a Z suffix; None means now."""
    moment = datetime.fromtimestamp(time.time() if epoch_s is None else epoch_s, timezone.utc)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def expiry_text(expires_at: float | None) -> str:
    try:
        return _FOREVER_TEXT if expires_at is None else rfc3339(expires_at)
    except (OverflowError, ValueError, OSError):  # past what a date can hold: never expires
        return _FOREVER_TEXT
