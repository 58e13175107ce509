"""One request's life as the server sees it: feeds the histograms and writes the request log line."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from mlxr.server.logs import REQUEST_LOGGER
from mlxr.server.metrics import ServerMetrics
from mlxr.types import RequestOutput

log = logging.getLogger(REQUEST_LOGGER)


@dataclass
class RequestTrace:
    request_id: str
    route: str
    arrival: float  # time.monotonic() when the HTTP request reached the route
    metrics: ServerMetrics | None = None
    model: str = ""
    quiet: bool = False  # the server's own warm-up (warm_requests.py): no request log line
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    status: int = 200
    finish_reasons: set[str] = field(default_factory=set)
    _queue_seen: set[str] = field(default_factory=set)
    # This request's child of each histogram: labels() once per request, not once per delta.
    _children: dict = field(default_factory=dict)

    def on_output(self, out: RequestOutput) -> None:
        """Call for every delta of every engine request that serves this HTTP request."""
        now = time.monotonic()
        new_tokens = sum(len(o.token_ids) for o in out.outputs)
        if new_tokens:
            if self.first_token_at is None:
                first = out.metrics.first_token_time if out.metrics and out.metrics.first_token_time else now
                self.first_token_at = first
                self._observe("ttft", first - self.arrival)
            elif self.last_token_at is not None:
                self._observe("itl", now - self.last_token_at)
            self.last_token_at = now
            self.completion_tokens += new_tokens
        self._observe_queue(out)

    def _observe_queue(self, out: RequestOutput) -> None:
        m = out.metrics
        if m is None or m.first_scheduled_time is None or out.request_id in self._queue_seen:
            return
        self._queue_seen.add(out.request_id)
        self._observe("queue", m.first_scheduled_time - m.arrival_time)

    def _observe(self, histogram: str, value: float) -> None:
        if self.metrics is None or not self.model:
            return
        child = self._children.get(histogram)
        if child is None:
            child = self._children[histogram] = getattr(self.metrics, histogram).labels(self.model)
        child.observe(max(value, 0.0))

    def finish(self, status: int, error: str | None = None) -> None:
        self.status = status
        duration = time.monotonic() - self.arrival
        if status < 400 and self.model:
            self._observe("e2e", duration)
            self._observe("prompt_tokens", self.prompt_tokens)
            self._observe("generation_tokens", self.completion_tokens)
        fields = {
            "request_id": self.request_id,
            "model": self.model or None,
            "route": self.route,
            "status": status,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "ttft_s": None if self.first_token_at is None else round(self.first_token_at - self.arrival, 4),
            "duration_s": round(duration, 4),
            "finish_reasons": sorted(self.finish_reasons) or None,
        }
        if error:
            fields["error"] = error
        if not self.quiet:
            log.info("request", extra={"fields": fields})
