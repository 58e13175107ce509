"""Logs on stderr: readable lines on a terminal, one JSON object per line otherwise (or with
--log-format json); and a throughput line while busy."""
from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from mlxr.types import EngineStats

REQUEST_LOGGER = "mlxr.request"
STATS_LOGGER = "mlxr.stats"
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


LOG_FORMATS = ("auto", "json", "human")


def log_error_response(route: str, status: int, reason: str, param: str | None = None) -> None:
    """The one line every 4xx and 5xx answer gets: route, status and reason."""
    fields = {"route": route, "status": status, "reason": reason[:500], "param": param}
    logging.getLogger(REQUEST_LOGGER).log(logging.WARNING if status >= 500 else logging.INFO, "error response",
                                          extra={"fields": fields})


def _fields(record: logging.LogRecord) -> dict:
    """`log.info("msg", extra={"fields": {...}})`'s fields and any other `extra` keys."""
    out = dict(getattr(record, "fields", None) or {})
    for key, value in vars(record).items():
        if key not in _STANDARD and key not in ("fields", "color_message"):
            out[key] = value
    return out


class JSONFormatter(logging.Formatter):
    """The fields go at the top level of the line's object."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update(_fields(record))
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class HumanFormatter(logging.Formatter):
    """The message, then the fields as key=value (rich's handler adds time, level, colour)."""

    def format(self, record: logging.LogRecord) -> str:
        pairs = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        text = f"{record.getMessage()}  {pairs}" if pairs else record.getMessage()
        return f"{text}\n{self.formatException(record.exc_info)}" if record.exc_info else text


def log_handler(log_format: str = "auto") -> logging.Handler:
    """auto: human on a terminal, JSON when stderr is a file or a pipe."""
    if log_format == "human" or (log_format == "auto" and sys.stderr.isatty()):
        from rich.console import Console
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(console=Console(stderr=True), show_path=False,
                                               markup=False, rich_tracebacks=False)
        handler.setFormatter(HumanFormatter())
        return handler
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter())
    return handler


def setup_logging(level: str = "INFO", log_format: str = "auto") -> None:
    handler = log_handler(log_format)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    # One line per request comes from mlxr.request; uvicorn's access log would repeat it.
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    # Request and throughput lines are the point of the log: keep them at any level.
    for name in (REQUEST_LOGGER, STATS_LOGGER):
        logging.getLogger(name).setLevel(logging.INFO)


@dataclass
class _Totals:
    prompt: int = 0
    generation: int = 0
    queried: int = 0
    hits: int = 0
    at: float = 0.0
    drafted: int = 0
    accepted: int = 0


class ThroughputLogger:
    """Every `every_s` while any engine has work: tok/s since the last line, load, KV, cache hits."""

    def __init__(self, snapshot: Callable[[], dict[str, EngineStats]], every_s: float = 5.0) -> None:
        self._snapshot = snapshot
        self.every_s = every_s
        self._last: dict[str, _Totals] = {}
        self._log = logging.getLogger(STATS_LOGGER)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            stats = await asyncio.to_thread(self._snapshot)
            self.tick(stats, time.monotonic())

    def tick(self, stats: dict[str, EngineStats], now: float) -> None:
        for model, s in stats.items():
            last = self._last.get(model, _Totals(at=now - self.every_s))
            cur = _Totals(s.prompt_tokens_total, s.generation_tokens_total,
                          s.prefix_cache_queried_tokens, s.prefix_cache_hit_tokens, now,
                          s.spec_num_draft_tokens, s.spec_num_accepted_tokens)
            self._last[model] = cur
            busy = s.num_requests_running or s.num_requests_waiting or cur.generation != last.generation
            if busy:
                self._log.info("throughput", extra={"fields": _line(model, s, last, cur)})
        for gone in set(self._last) - set(stats):
            del self._last[gone]


def _line(model: str, s: EngineStats, last: _Totals, cur: _Totals) -> dict:
    dt = max(cur.at - last.at, 1e-9)
    queried = cur.queried - last.queried
    return {
        "model": model,
        "prompt_tok_s": round((cur.prompt - last.prompt) / dt, 1),
        "generation_tok_s": round((cur.generation - last.generation) / dt, 1),
        "running": s.num_requests_running,
        "waiting": s.num_requests_waiting,
        "kv_usage": round(s.kv_cache_usage, 4),
        "prefix_cache_hit_rate": round((cur.hits - last.hits) / queried, 4) if queried else 0.0,
        **_spec_fields(s, last, cur),
    }


def _spec_fields(s: EngineStats, last: _Totals, cur: _Totals) -> dict:
    """Speculative decoding's acceptance since the last line (only when it drafted at all)."""
    if not s.spec_num_draft_tokens:
        return {}
    drafted = cur.drafted - last.drafted
    return {"spec_draft_tok_s": round(drafted / max(cur.at - last.at, 1e-9), 1),
            "spec_acceptance_rate": round((cur.accepted - last.accepted) / drafted, 4) if drafted else 0.0}
