"""vLLM's tokenizer routes: POST /tokenize (a prompt, or messages through the chat template),
POST /detokenize and GET /tokenizer_info, in vLLM's shapes (lm-evaluation-harness's remote
tokenizer reads them). Same API key as the other routes; the prompt bounds of /v1/completions
(characters before tokenizing: prompt_work.check_prompt_chars; token ids: the vocabulary)."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field

from mlxr.errors import InvalidParameterError
from mlxr.server.openai.prompts import message_dict, render_plan
from mlxr.server.openai.schemas import ChatMessage, TokenIds, _Body
from mlxr.server.prompt_work import check_prompt_chars, off_loop
from mlxr.server.session import Session

router = APIRouter(tags=["vllm"])


class TokenizeRequest(_Body):
    """vLLM's two forms in one body: `prompt` (completions) or `messages` (chat)."""

    model: str | None = Field(None, max_length=512)
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1, max_length=4096)
    add_special_tokens: bool | None = None  # vLLM's default: True for a prompt, False for messages
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(_Body):
    model: str | None = Field(None, max_length=512)
    tokens: TokenIds


async def _session(request: Request, model: str | None, route: str) -> Session:
    return await Session.open(request, model, route, "tok-")


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
    if (body.prompt is None) == (body.messages is None):
        raise InvalidParameterError("prompt", "give either prompt or messages")
    session = await _session(request, body.model, "/tokenize")
    try:
        served = session.served
        ids = await _ids(served, body)
        out: dict[str, Any] = {"count": len(ids), "max_model_len": served.context_length, "tokens": ids,
                               "token_strs": None}
        if body.return_token_strs:
            out["token_strs"] = [served.tokenizer.id_to_token(i) for i in ids]
    except BaseException as e:
        await session.fail(e)
        raise
    await session.close(200)
    return out


async def _ids(served: Any, body: TokenizeRequest) -> list[int]:
    tokenizer, context = served.tokenizer, served.context_length
    if body.prompt is not None:
        special = body.add_special_tokens is not False

        def run() -> list[int]:
            check_prompt_chars(tokenizer, context, body.prompt, "prompt")
            return tokenizer.encode(body.prompt, add_special_tokens=special)

        return await off_loop(run)
    messages = [message_dict(i, m) for i, m in enumerate(body.messages or [])]
    ids, _ = await render_plan(tokenizer, context, "messages", messages, None,
                               template_kwargs=body.chat_template_kwargs,
                               add_generation_prompt=body.add_generation_prompt)
    if body.add_special_tokens and tokenizer.add_bos_token and ids[:1] != [tokenizer.bos_token_id]:
        ids = [tokenizer.bos_token_id, *ids]
    return ids


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
    session = await _session(request, body.model, "/detokenize")
    try:
        tokenizer = session.served.tokenizer
        if any(t >= tokenizer.vocab_size for t in body.tokens):
            raise InvalidParameterError("tokens", f"token ids must be below the vocabulary size {tokenizer.vocab_size}")
        text = await off_loop(tokenizer.decode, body.tokens)
    except BaseException as e:
        await session.fail(e)
        raise
    await session.close(200)
    return {"prompt": text}


@router.get("/tokenizer_info")
async def tokenizer_info(request: Request, model: str | None = None) -> dict[str, Any]:
    """What vLLM gives: the tokenizer's configuration, as tokenizer_config.json holds it."""
    session = await _session(request, model, "/tokenizer_info")
    try:
        served = session.served
        info = _info(served.tokenizer, served.context_length)
    except BaseException as e:
        await session.fail(e)
        raise
    await session.close(200)
    return info


def _info(tokenizer: Any, context_length: int) -> dict[str, Any]:
    def text(token_id: int | None) -> str | None:
        return None if token_id is None else tokenizer.id_to_token(token_id)

    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": text(tokenizer.bos_token_id),
            "eos_token": text(tokenizer.eos_token_id), "pad_token": None,
            "add_bos_token": tokenizer.add_bos_token, "model_max_length": context_length,
            "vocab_size": tokenizer.vocab_size, "chat_template": tokenizer.template_source}
