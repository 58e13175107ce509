"""Running one generate/chat request on the engine and writing Ollama's responses: NDJSON
chunks while streaming, then a final object with done_reason and measured durations (ns).

prompt_eval_duration runs from the model being ready (the request reaching the engine) to
the first generated token, so total = load + prompt_eval + eval as in Ollama."""
from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from fastapi.responses import JSONResponse, Response

from mlxr.errors import MLXRError
from mlxr.server.ollama.durations import ns, rfc3339
from mlxr.server.chat_plan import ChatPlan
from mlxr.server.ollama.loading import Hold
from mlxr.server.ollama.replies import StreamedMessage, whole_message
from mlxr.server.reasoning_budget import BudgetedReply
from mlxr.server.session import SessionStream, status_of
from mlxr.types import Logprob, RequestOutput, SamplingParams, TokenLogprobs

NDJSON = "application/x-ndjson"
TRUNCATED_HEADER = "X-MLXR-Prompt-Truncated"  # "<prompt tokens> <kept tokens>"


@dataclass
class Job:
    hold: Hold
    model: str  # the name the client asked for, echoed back as Ollama does
    prompt_ids: list[int]
    params: SamplingParams
    chat: bool
    arrival: float  # time.perf_counter() when the request arrived
    top_logprobs: int | None = None  # None: no logprobs; else alternatives per token
    plan: ChatPlan | None = None  # chat: how the reply is read (tools, thinking)
    truncated_from: int | None = None  # the prompt's tokens before it was cut to fit num_ctx
    think_budget: int | None = None  # chat: the reasoning's tokens (`think` "low" / "medium")


@dataclass
class Tally:
    """What the engine has produced so far for one request."""

    parts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    first_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    # Tokens (and their logprobs) not yet sent: a token whose text is held back by the
    # detokenizer goes out with the next chunk that has text, or with the final object.
    unsent_ids: list[int] = field(default_factory=list)
    unsent_logprobs: list[TokenLogprobs] = field(default_factory=list)

    def add(self, out: RequestOutput) -> str:
        c = out.outputs[0]
        if c.token_ids and self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self.token_ids += c.token_ids
        self.unsent_ids += c.token_ids
        self.unsent_logprobs += c.logprobs or []
        self.parts.append(c.text)
        if out.finished:
            self.finished_at = time.perf_counter()
            self.finish_reason = c.finish_reason
        return c.text


def content(chat: bool, text: str) -> dict[str, Any]:
    return {"message": {"role": "assistant", "content": text}} if chat else {"response": text}


def take_logprobs(job: Job, tally: Tally) -> dict[str, Any]:
    """Ollama's `logprobs` for the tokens not sent yet ({} when not asked for)."""
    ids, entries = tally.unsent_ids, tally.unsent_logprobs
    tally.unsent_ids, tally.unsent_logprobs = [], []
    if job.top_logprobs is None:
        return {}
    return {"logprobs": [_token_logprob(t, e, job.top_logprobs) for t, e in zip(ids, entries)]}


def _token_logprob(token: int, entry: TokenLogprobs, top_n: int) -> dict[str, Any]:
    chosen = entry.get(token) or Logprob(float("-inf"), 0, "")
    item = _token_json(chosen)
    if top_n:
        top = sorted((lp for lp in entry.values() if lp.rank <= top_n), key=lambda lp: lp.rank)
        item["top_logprobs"] = [_token_json(lp) for lp in top]
    return item


def _token_json(lp: Logprob) -> dict[str, Any]:
    value = lp.logprob if math.isfinite(lp.logprob) else -9999.0  # JSON has no -inf
    return {"token": lp.decoded, "logprob": value, "bytes": list(lp.decoded.encode("utf-8"))}


def line(obj: dict[str, Any]) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_APPEND_NEWLINE)


def final_object(job: Job, tally: Tally, text: str, message: dict[str, Any] | None = None) -> dict[str, Any]:
    end = tally.finished_at or time.perf_counter()
    first = tally.first_token_at or end
    said = {"message": message} if message is not None else content(job.chat, text)
    body = {"model": job.model, "created_at": rfc3339(), **said, "done": True,
            "done_reason": "length" if tally.finish_reason == "length" else "stop", **take_logprobs(job, tally)}
    if not job.chat:
        body["context"] = job.prompt_ids + tally.token_ids
    if job.truncated_from is not None:
        body["prompt_truncated"] = {"prompt_tokens": job.truncated_from, "kept_tokens": len(job.prompt_ids)}
    return body | {
        "total_duration": ns(end - job.arrival),
        "load_duration": ns(job.hold.load_s),
        "prompt_eval_count": len(job.prompt_ids),
        "prompt_eval_duration": ns(first - job.hold.ready_at),
        "eval_count": len(tally.token_ids),
        "eval_duration": ns(end - first),
    }


async def run(job: Job, stream: bool) -> Response:
    """Admission errors (too long, overloaded) become HTTP errors before anything is sent;
    a client that leaves aborts the engine request (the session watches for it)."""
    session = job.hold.session
    steps = _steps(job)
    steps.start(job.prompt_ids)
    item = await steps.next()
    tally = Tally()
    if stream:
        session.stop_watching()
        return _marked(job, SessionStream(session, _ndjson(job, tally, item, steps), media_type=NDJSON))
    while item is not None:
        tally.add(item[1])
        item = await steps.next()
    await job.hold.finish()
    await job.hold.unload_if_asked()
    text = "".join(tally.parts)
    message = whole_message(job.plan, text) if job.chat else None
    return _marked(job, JSONResponse(final_object(job, tally, text, message)))


def _marked(job: Job, response: Response) -> Response:
    """A prompt cut to fit says so in a header too (a streamed reply's final line comes last)."""
    if job.truncated_from is not None:
        response.headers[TRUNCATED_HEADER] = f"{job.truncated_from} {len(job.prompt_ids)}"
    return response


def _steps(job: Job) -> BudgetedReply:
    """The engine requests of the reply: one, or two where a chat's reasoning has a budget."""
    plan = job.plan if job.plan is not None else ChatPlan()
    return BudgetedReply(job.hold.session, plan, job.params, job.think_budget)


async def _ndjson(job: Job, tally: Tally, item: tuple[int, RequestOutput] | None,
                  steps: BudgetedReply) -> AsyncIterator[bytes]:
    # A client that goes away cancels this generator; SessionStream then closes the session.
    session = job.hold.session
    reply = StreamedMessage(job.plan) if job.chat else None
    try:
        while item is not None:
            delta = tally.add(item[1])
            if reply is None:
                said = content(False, delta) if delta else {}
            else:
                said = _said(reply.delta(delta, item[1].finished))
            if said:
                yield line({"model": job.model, "created_at": rfc3339(), **said, "done": False,
                            **take_logprobs(job, tally)})
            item = await steps.next()
        session.outcome = (200, None)
        await job.hold.finish()
        await job.hold.unload_if_asked()
        yield line(final_object(job, tally, ""))
    except Exception as e:  # noqa: BLE001 - the status line is gone; report in-band
        session.outcome = (status_of(e), str(e) or type(e).__name__)
        yield line({"error": e.message if isinstance(e, MLXRError) else "internal error"})


def _said(message: dict[str, Any] | None) -> dict[str, Any]:
    return {"message": message} if message is not None else {}
