"""POST /v1/completions: one prompt or a batch (string, strings, token ids, lists of ids)."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from mlxr.chat.reasoning import markers_for_template
from mlxr.errors import InvalidParameterError
from mlxr.server.chat_plan import ChatPlan
from mlxr.server.openai.choices import Choice, Choices, completion_logprobs
from mlxr.server.openai.prompt_scores import echo_logprobs, join_logprobs, score_prompts, vllm_prompt_logprobs
from mlxr.server.openai.prompts import check_fits, check_unsupported, encode_inputs, sampling_params
from mlxr.server.openai.schemas import CompletionRequest
from mlxr.server.openai.sse import events, stream_response
from mlxr.server.prompt_work import off_loop
from mlxr.server.reasoning_budget import BudgetedReply, check_budget
from mlxr.server.reply_budget import reply_budget
from mlxr.server.session import Session
from mlxr.types import CompletionOutput, RequestOutput

router = APIRouter()
ROUTE = "/v1/completions"


@router.post(ROUTE)
async def completions(body: CompletionRequest, request: Request) -> Response:
    session = await Session.open(request, body.model, ROUTE, "cmpl-")
    try:
        return await _complete(session, body)
    except BaseException as e:
        await session.fail(e)
        raise


def _check_unsupported(body: CompletionRequest) -> None:
    if body.suffix:
        raise InvalidParameterError("suffix", "is not supported")
    check_unsupported(body)
    if body.max_tokens == 0 and not body.echo:
        raise InvalidParameterError("max_tokens", "0 is only for echo (the prompt alone, scored with logprobs)")


async def _complete(session: Session, body: CompletionRequest) -> Response:
    _check_unsupported(body)
    served = session.served
    prompts = await off_loop(encode_inputs, served.tokenizer, body.prompt, "prompt", served.context_length)
    if len(prompts) * body.n > 64:
        raise InvalidParameterError("n", f"{len(prompts)} prompts x n={body.n} is over 64 choices")
    generates = body.max_tokens != 0
    budget = reply_budget(session.request, body.max_tokens, max(map(len, prompts), default=0), served.context_length)
    params = sampling_params(body, budget, body.logprobs, served.sampling) if generates else None
    for ids in prompts:
        check_fits(len(ids), served.context_length, body.max_tokens)
    choices = Choices(len(prompts), body.n)
    choices.prompt_tokens = sum(len(p) for p in prompts)
    fmt = _CompletionFormat(session, choices, body, _echo_texts(served.tokenizer, body, prompts))
    session.check_admissible(len(prompts))
    await fmt.score(prompts, served)
    if not generates:
        return await _prompts_alone(session, body, fmt)
    steps = BudgetedReply(session, _reasoning_plan(served.tokenizer, body, prompts), params,
                          check_budget("thinking_token_budget", body.thinking_token_budget))
    if steps.budget is None:
        session.start(prompts, params)
    else:
        steps.start(prompts[0])
    first = await steps.next()  # admission errors surface here, before any header is sent
    if body.stream:
        return stream_response(session, events(session, first, fmt.head(), fmt.chunks, fmt.tail, steps))
    item = first
    while item is not None:
        choices.apply(*item)
        item = await steps.next()
    await session.close(200)
    return JSONResponse(fmt.full())


def _reasoning_plan(tokenizer, body: CompletionRequest, prompts: list[list[int]]) -> ChatPlan:
    """Where thinking_token_budget applies: one prompt, n = 1, a template that reasons between
    markers; the reply starts inside the reasoning where the prompt ends with its opener."""
    if body.thinking_token_budget is None:
        return ChatPlan()
    markers = markers_for_template(tokenizer.template_source)
    if markers is None or len(prompts) != 1 or body.n != 1:
        raise InvalidParameterError("thinking_token_budget", "needs one prompt, n = 1 and a model whose chat "
                                                             "template reasons between markers")
    opened = tokenizer.decode(prompts[0], skip_special_tokens=False).rstrip().endswith(markers.start)
    return ChatPlan(markers=markers, reasoning=("" if opened else markers.start, markers.end))


def _echo_texts(tokenizer, body: CompletionRequest, prompts: list[list[int]]) -> list[str] | None:
    if not body.echo:
        return None
    raw = body.prompt
    if isinstance(raw, str):
        return [raw]
    if raw and all(isinstance(p, str) for p in raw):
        return list(raw)
    return [tokenizer.decode(p) for p in prompts]


async def _prompts_alone(session: Session, body: CompletionRequest, fmt: "_CompletionFormat") -> Response:
    """max_tokens 0: the echoed prompts (scored, with logprobs), nothing generated."""
    session.trace.prompt_tokens = fmt.choices.prompt_tokens
    for c in fmt.choices.items:
        c.finish_reason = "length"
    if body.stream:
        return stream_response(session, events(session, None, fmt.head(), fmt.chunks, fmt.tail))
    await session.close(200)
    return JSONResponse(fmt.full())


class _CompletionFormat:
    def __init__(self, session: Session, choices: Choices, body: CompletionRequest, echo: list[str] | None) -> None:
        self.session, self.choices, self.echo = session, choices, echo
        self.top_n = body.logprobs
        self.vllm_top = body.prompt_logprobs
        opts = body.stream_options
        self.include_usage = bool(body.stream and opts and opts.include_usage)
        # Prompt logprobs, where asked for, a prompt each: legacy (echo) and vLLM's shape
        self.echo_parts: list[dict] | None = None
        self.vllm_parts: list[list[dict | None]] | None = None

    async def score(self, prompts: list[list[int]], served) -> None:
        """Prompt logprobs: for echo with logprobs, and for vLLM's prompt_logprobs."""
        wants_echo = self.echo is not None and self.top_n is not None
        if not wants_echo and self.vllm_top is None:
            return
        top = max(self.top_n if wants_echo else 0, self.vllm_top or 0)
        scores = await self.session.watched(score_prompts(served.engine, prompts, top))
        if self.vllm_top is not None:
            self.vllm_parts = [vllm_prompt_logprobs(ids, e, self.vllm_top) for ids, e in zip(prompts, scores)]
        if wants_echo:
            decode = lambda t: served.tokenizer.decode([t], skip_special_tokens=False)  # noqa: E731
            shown = lambda t: served.tokenizer.decode([t], skip_special_tokens=True)  # noqa: E731
            parts = [echo_logprobs(ids, e, self.top_n, decode, shown, text)
                     for ids, e, text in zip(prompts, scores, self.echo)]
            self.echo_parts = [logprobs for logprobs, _ in parts]
            for c in self.choices.items:  # generated tokens' offsets go on from the prompt's (as vLLM's)
                c.text_offset = parts[c.index // self.choices.n][1]

    def _prompt_fields(self, choice_index: int) -> tuple[dict | None, dict]:
        """(the echoed prompt's legacy logprobs or None, extra choice fields)."""
        p = choice_index // self.choices.n
        extra = {} if self.vllm_parts is None else {"prompt_logprobs": self.vllm_parts[p]}
        return (None if self.echo_parts is None else self.echo_parts[p]), extra

    def _envelope(self, choices: list[dict]) -> dict:
        s = self.session
        out = {"id": s.request_id, "object": "text_completion", "created": s.created, "model": s.model,
               "choices": choices}
        if self.include_usage:
            out["usage"] = None
        return out

    def head(self) -> list[dict]:
        """The first chunk: the echoed prompts (with their logprobs), and vLLM's prompt_logprobs."""
        if self.echo is None and self.vllm_parts is None:
            return []
        n = self.choices.n
        items = []
        for c in self.choices.items:
            logprobs, extra = self._prompt_fields(c.index)
            text = self.echo[c.index // n] if self.echo is not None else ""
            items.append({"index": c.index, "text": text, "logprobs": logprobs, "finish_reason": c.finish_reason,
                          **extra})
            c.finish_sent = c.finish_reason is not None
        return [self._envelope(items)]

    def chunks(self, prompt_index: int, out: RequestOutput) -> list[dict]:
        return [self._envelope([self._delta(c, o)]) for c, o in self.choices.apply(prompt_index, out)]

    def _delta(self, choice: Choice, o: CompletionOutput) -> dict:
        logprobs = None
        if self.top_n is not None and o.token_ids:
            logprobs = completion_logprobs(choice, o.token_ids, o.logprobs or [], self.top_n)
        finish = choice.finish_reason if not choice.finish_sent else None
        choice.finish_sent = choice.finish_reason is not None
        return {"index": choice.index, "text": o.text, "logprobs": logprobs, "finish_reason": finish}

    def tail(self) -> list[dict]:
        if not self.include_usage:
            return []
        last = self._envelope([])
        last["usage"] = self.choices.usage()
        return [last]

    def full(self) -> dict:
        out = self._envelope([self._choice(c) for c in self.choices.items])
        out["usage"] = self.choices.usage()
        return out

    def _choice(self, c: Choice) -> dict:
        prompt_part, extra = self._prompt_fields(c.index)
        logprobs = None
        if self.top_n is not None:
            logprobs = completion_logprobs(c, c.token_ids, c.logprobs, self.top_n)
            if prompt_part is not None:
                logprobs = join_logprobs(prompt_part, logprobs)
        text = (self.echo[c.index // self.choices.n] if self.echo else "") + c.text
        return {"index": c.index, "text": text, "logprobs": logprobs, "finish_reason": c.finish_reason, **extra}
