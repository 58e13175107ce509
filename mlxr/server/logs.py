"""Structured logs: one JSON object per line on stderr, and a throughput line while busy."""
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


class JSONFormatter(logging.Formatter):
    """`log.info("msg", extra={"fields": {...}})` puts the fields at the top level."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line.update(fields)
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in ("fields", "color_message"):
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def setup_json_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter())
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
                          s.prefix_cache_queried_tokens, s.prefix_cache_hit_tokens, now)
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
    }
