"""Prompt logprobs on the OpenAI routes: the legacy `echo` + `logprobs` of /v1/completions
(what lm-evaluation-harness's loglikelihood tasks send) and vLLM's `prompt_logprobs` extra."""
from __future__ import annotations

from collections.abc import Callable

from mlxr.server.openai.choices import NO_PROB, finite
from mlxr.types import TokenLogprobs

Entries = list[TokenLogprobs | None]  # one per prompt token; the first has none


async def score_prompts(engine, prompts: list[list[int]], top: int) -> list[Entries]:
    """Each prompt's entries, computed on the engine thread between steps."""
    return [(await engine.prompt_logprobs(ids, top))[1] for ids in prompts]


def echo_logprobs(ids: list[int], entries: Entries, top_n: int, decode: Callable[[int], str]) -> dict:
    """The legacy logprobs object of the echoed prompt: the first token has no logprob (null)."""
    tokens, values, tops, offsets = [], [], [], []
    offset = 0
    for token, entry in zip(ids, entries):
        if entry is None:
            text, value, top = decode(token), None, None
        else:
            chosen = entry.get(token)
            text = chosen.decoded if chosen else decode(token)
            value = finite(chosen.logprob) if chosen else NO_PROB
            top = {lp.decoded: finite(lp.logprob) for lp in entry.values() if 0 < lp.rank <= top_n}
            top.setdefault(text, value)
        tokens.append(text)
        values.append(value)
        tops.append(top)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def join_logprobs(head: dict, rest: dict | None) -> dict:
    """The prompt's legacy logprobs followed by the generated tokens'."""
    if rest is None:
        return head
    return {key: head[key] + rest[key] for key in head}


def vllm_prompt_logprobs(ids: list[int], entries: Entries, top_n: int) -> list[dict | None]:
    """vLLM's shape: per position None or {token id: {logprob, rank, decoded_token}}, holding
    the prompt's token and the top_n likeliest."""
    out: list[dict | None] = []
    for token, entry in zip(ids, entries):
        if entry is None:
            out.append(None)
            continue
        out.append({t: {"logprob": finite(lp.logprob), "rank": lp.rank, "decoded_token": lp.decoded}
                    for t, lp in entry.items() if t == token or lp.rank <= top_n})
    return out
