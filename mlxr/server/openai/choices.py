"""Engine outputs -> OpenAI choices: accumulate deltas per choice, format logprobs and usage."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from mlxr.types import CompletionOutput, Logprob, RequestOutput, TokenLogprobs

NO_PROB = -9999.0  # OpenAI's stand-in for log(0); JSON has no -Infinity


def finite(x: float) -> float:
    return x if math.isfinite(x) else NO_PROB


@dataclass
class Choice:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish_reason: str | None = None
    finish_sent: bool = False
    text_offset: int = 0  # completions logprobs: where the next token's text starts


class Choices:
    """All choices of one HTTP request: prompt p, sequence i -> choice p * n + i."""

    def __init__(self, num_prompts: int, n: int) -> None:
        self.n = n
        self.items = [Choice(i) for i in range(num_prompts * n)]
        self.prompt_tokens = 0
        self.cached: dict[int, int] = {}  # prompt -> its tokens served from the prefix cache

    def apply(self, prompt_index: int, out: RequestOutput) -> list[tuple[Choice, CompletionOutput]]:
        """Fold one delta in; returns the (choice, delta) pairs that carry something new."""
        fresh = []
        if out.num_cached_tokens:
            self.cached[prompt_index] = out.num_cached_tokens
        for o in out.outputs:
            choice = self.items[prompt_index * self.n + o.index]
            new_finish = o.finish_reason is not None and choice.finish_reason is None
            if not (o.text or o.token_ids or new_finish):
                continue
            choice.text += o.text
            choice.token_ids += o.token_ids
            choice.logprobs += o.logprobs or []
            if new_finish:
                choice.finish_reason = o.finish_reason
            fresh.append((choice, o))
        return fresh

    @property
    def completion_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.items)

    def usage(self) -> dict:
        """OpenAI's usage, with the prompt tokens the prefix cache served (as Responses counts them)."""
        done = self.completion_tokens
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": done,
                "total_tokens": self.prompt_tokens + done,
                "prompt_tokens_details": {"cached_tokens": sum(self.cached.values())}}


def _top(entry: TokenLogprobs, top_n: int) -> list[tuple[int, Logprob]]:
    return sorted(((t, lp) for t, lp in entry.items() if lp.rank <= top_n), key=lambda x: x[1].rank)


def _chosen(token: int, entry: TokenLogprobs) -> Logprob:
    return entry.get(token) or Logprob(NO_PROB, 0, "")


def _token_json(lp: Logprob) -> dict:
    return {"token": lp.decoded, "logprob": finite(lp.logprob), "bytes": list(lp.decoded.encode("utf-8"))}


def chat_logprobs(token_ids: list[int], entries: list[TokenLogprobs], top_n: int) -> dict:
    content = []
    for token, entry in zip(token_ids, entries):
        item = _token_json(_chosen(token, entry))
        item["top_logprobs"] = [_token_json(lp) for _, lp in _top(entry, top_n)]
        content.append(item)
    return {"content": content}


def completion_logprobs(choice: Choice, token_ids: list[int], entries: list[TokenLogprobs], top_n: int) -> dict:
    """Legacy shape; text_offset continues across streamed chunks through `choice`."""
    tokens, values, tops, offsets = [], [], [], []
    for token, entry in zip(token_ids, entries):
        lp = _chosen(token, entry)
        tokens.append(lp.decoded)
        values.append(finite(lp.logprob))
        top = {t_lp.decoded: finite(t_lp.logprob) for _, t_lp in _top(entry, top_n)}
        top.setdefault(lp.decoded, finite(lp.logprob))
        tops.append(top)
        offsets.append(choice.text_offset)
        choice.text_offset += len(lp.decoded)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}
