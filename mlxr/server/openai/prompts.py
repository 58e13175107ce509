"""Request fields -> what the engine takes: token ids per prompt and SamplingParams."""
from __future__ import annotations

from typing import Any

from mlxr.errors import ContextLengthError, InvalidParameterError
from mlxr.loader.sampling_defaults import SamplingDefaults
from mlxr.server.chat_plan import ChatPlan, check_forced_calls, plan_chat
from mlxr.server.prompt_work import check_prompt_chars, off_loop
from mlxr.server.tool_history import check_tool_calls
from mlxr.server.openai.strict_schema import strict_tool
from mlxr.server.openai.structured import structured_outputs
from mlxr.server.openai.schemas import (
    MAX_LOGIT_BIAS,
    ChatCompletionRequest,
    ChatMessage,
    SamplingFields,
)
from mlxr.types import SamplingParams


def sampling_params(body: SamplingFields, max_tokens: int | None, logprobs: int | None,
                    defaults: SamplingDefaults | None = None) -> SamplingParams:
    """Raises InvalidParameterError naming the field for anything out of range. A field the
    request leaves out takes the model's default (its files, preset or Modelfile), else the
    OpenAI API's."""
    d = defaults or SamplingDefaults()
    return SamplingParams(
        n=body.n,
        max_tokens=max_tokens,
        min_tokens=body.min_tokens,
        temperature=d.get("temperature", 1.0) if body.temperature is None else body.temperature,
        top_k=d.get("top_k", 0) if body.top_k is None else body.top_k,
        top_p=d.get("top_p", 1.0) if body.top_p is None else body.top_p,
        min_p=d.get("min_p", 0.0) if body.min_p is None else body.min_p,
        repetition_penalty=d.get("repetition_penalty", 1.0) if body.repetition_penalty is None
        else body.repetition_penalty,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        seed=body.seed,
        stop=body.stop,
        stop_token_ids=body.stop_token_ids,
        ignore_eos=body.ignore_eos,
        logprobs=logprobs,
        logit_bias=parse_logit_bias(body.logit_bias),
        structured_outputs=structured_outputs(body),
        priority=body.priority,
    )


def check_unsupported(body: SamplingFields) -> None:
    """vLLM's fields for what this server does not do are a 400 naming the field, as vLLM
    refuses what it does not support; their no-op values (which clients send) pass."""
    if body.best_of is not None and body.best_of != body.n:
        raise InvalidParameterError("best_of", "only best_of equal to n is supported")
    if body.use_beam_search:
        raise InvalidParameterError("use_beam_search", "beam search is not supported")
    if getattr(body, "chat_template", None) is not None:
        raise InvalidParameterError("chat_template", "a chat template in the request is not supported: the "
                                    "model's own renders (vLLM refuses one unless --trust-request-chat-template)")


def parse_logit_bias(raw: dict[str, float] | None) -> dict[int, float] | None:
    if not raw:
        return None
    if len(raw) > MAX_LOGIT_BIAS:
        raise InvalidParameterError("logit_bias", f"at most {MAX_LOGIT_BIAS} entries")
    out: dict[int, float] = {}
    for key, bias in raw.items():
        k = key.strip()
        if not (k.isascii() and k.isdigit()) or len(k) > 10:  # "²".isdigit() is True
            raise InvalidParameterError("logit_bias", f"keys must be token ids, got {key!r}")
        if not -100.0 <= bias <= 100.0:
            raise InvalidParameterError("logit_bias", f"values must be in [-100, 100], got {bias}")
        out[int(k)] = float(bias)
    return out


def check_fits(prompt_len: int, context: int, max_tokens: int | None, param: str = "prompt") -> None:
    """Never truncate: too long is a 400 naming both numbers (the engine checks again)."""
    if prompt_len >= context:
        raise ContextLengthError(prompt_len, context, param=param)
    if max_tokens is not None and prompt_len + max_tokens > context:
        raise ContextLengthError(prompt_len, context, max_tokens)


def encode_inputs(tokenizer: Any, raw: Any, param: str, context_length: int) -> list[list[int]]:
    """str | [str] | [int] | [[int]] -> one token-id list per prompt. Slow for long texts:
    call it through off_loop."""
    if isinstance(raw, str):
        prompts: list = [raw]
    elif raw and all(isinstance(t, int) for t in raw):
        prompts = [raw]
    else:
        prompts = list(raw)
    if not prompts:
        raise InvalidParameterError(param, "is empty")
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            check_prompt_chars(tokenizer, context_length, p, param if len(prompts) == 1 else f"{param}[{i}]")
    out = [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
    for i, ids in enumerate(out):
        if not ids:
            raise InvalidParameterError(param if len(out) == 1 else f"{param}[{i}]", "is empty")
        vocab = tokenizer.vocab_size
        if any(t >= vocab for t in ids):
            raise InvalidParameterError(param, f"token ids must be below the vocabulary size {vocab}")
    return out


def message_dict(i: int, m: ChatMessage, images: ImageSources | None = None) -> dict[str, Any]:
    """A message for the chat template; an image part becomes the model's image marker in the
    text, its source kept in `images` (None: a route that takes no images)."""
    d = m.model_dump(exclude_none=True)
    check_tool_calls(d.get("tool_calls"), f"messages.{i}")
    if isinstance(m.content, list):
        texts = []
        for j, part in enumerate(m.content):
            if part.type == "image_url" and images is not None:
                texts.append(images.add(f"messages[{i}].content[{j}]", (part.model_extra or {}).get("image_url")))
                continue
            if part.type != "text":
                raise InvalidParameterError(
                    f"messages[{i}].content", f"content parts of type {part.type!r} are not supported")
            if part.text is None:
                raise InvalidParameterError(f"messages[{i}].content[{j}].text", "is missing: a part of type 'text' needs its text")
            texts.append(part.text)
        d["content"] = "".join(texts)
    elif m.content is None:
        d["content"] = ""
    return d


async def render_chat(tokenizer: Any, body: ChatCompletionRequest, context_length: int,
                      images: ImageSources | None = None) -> tuple[list[int], ChatPlan]:
    """The chat template's prompt as token ids (its text already carries BOS and markers), and
    the plan its reply is read back with (tools, reasoning; see server/chat_plan.py). With image
    parts, the ids carry the images (ImagePromptIds)."""
    messages = [message_dict(i, m, images) for i, m in enumerate(body.messages)]
    tools = [strict_tool(t.model_dump(exclude_none=True)) for t in body.tools] if body.tools else None
    thinking = None if body.reasoning_effort is None else body.reasoning_effort != "none"
    fmt = getattr(body, "response_format", None)
    return await render_plan(tokenizer, context_length, "messages", messages, tools, tool_choice=body.tool_choice,
                             parallel=body.parallel_tool_calls, thinking=thinking, effort=body.reasoning_effort,
                             template_kwargs=body.chat_template_kwargs,
                             add_generation_prompt=body.add_generation_prompt,
                             other_constraint=fmt is not None and fmt.type != "text", images=images)


async def render_plan(tokenizer: Any, context_length: int, field: str, messages: list[dict], tools: list | None,
                      images: ImageSources | None = None, **plan_options: Any) -> tuple[list[int], ChatPlan]:
    """plan_chat's prompt as token ids, and the plan; errors name the request's `field`."""
    def run() -> tuple[list[int], ChatPlan]:
        plan = plan_chat(tokenizer, messages, tools, **plan_options)
        check_prompt_chars(tokenizer, context_length, plan.prompt_text, field)
        if images:
            return images.prompt_ids(plan.prompt_text, tokenizer), plan
        return tokenizer.encode(plan.prompt_text, add_special_tokens=False), plan

    # Rendering runs untrusted template code with a time budget: keep it off the event loop.
    ids, plan = await off_loop(run)
    if not ids:
        raise InvalidParameterError(field, "the rendered prompt is empty")
    await check_forced_calls(plan)
    return ids, plan
