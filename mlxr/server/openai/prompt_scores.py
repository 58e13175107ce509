"""Prompt logprobs on the OpenAI routes: the legacy `echo` + `logprobs` of /v1/completions
(what lm-evaluation-harness's loglikelihood tasks send) and vLLM's `prompt_logprobs` extra."""
from __future__ import annotations

from collections.abc import Callable

from mlxr.server.openai.choices import Choice, completion_logprobs, finite
from mlxr.types import TokenLogprobs

Entries = list[TokenLogprobs | None]  # one per prompt token; the first has none


async def score_prompts(engine, prompts: list[list[int]], top: int) -> list[Entries]:
    """Each prompt's entries, computed on the engine thread between steps."""
    return [(await engine.prompt_logprobs(ids, top))[1] for ids in prompts]


def echo_logprobs(ids: list[int], entries: Entries, top_n: int, decode: Callable[[int], str],
                  shown: Callable[[int], str], text: str) -> tuple[dict, int]:
    """The legacy logprobs object of the echoed prompt `text` (the first token's logprob is null;
    the others as generated tokens' are), and the offset the generated tokens' text goes on from.
    `decode` names a token (`<bos>` too); a token whose `shown` text is empty (a special token,
    which the echoed prompt does not hold) adds nothing to the offsets, so they index `text`."""
    rest = completion_logprobs(Choice(0), ids[1:], entries[1:], top_n)
    head = {"tokens": [decode(ids[0])], "token_logprobs": [None], "top_logprobs": [None], "text_offset": [0]}
    logprobs = join_logprobs(head, rest)
    offsets, at = [], 0
    for token, name in zip(ids, logprobs["tokens"]):
        offsets.append(min(at, len(text)))
        at += len(name) if shown(token) else 0
    logprobs["text_offset"] = offsets
    return logprobs, len(text)


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
