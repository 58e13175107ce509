"""The engine core's one record of a request: its known tokens and counters. Pure Python.

token_ids holds the tokens known on the host (prompt, then outputs). Tokens sampled by a
launched step but not yet landed are counted in num_in_flight, never stored as a stand-in:
num_tokens counts both, and tokens [num_computed_tokens:num_tokens] still have to run."""
from __future__ import annotations

import enum

from mlxr.engine.records import EngineCoreRequest


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"


class Request:
    __slots__ = (
        "request_id", "params", "token_ids", "num_prompt_tokens", "max_output_tokens",
        "eos_token_ids", "arrival_time", "status", "num_computed_tokens", "num_in_flight",
        "block_table", "block_hashes", "host_block_table", "finish_reason", "stop_reason",
        "num_cached_tokens", "spec_token_ids", "first_scheduled_time", "runner_knows", "grammar",
        "images", "image_spans", "lora_name", "lora_id", "lora_root",
    )

    def __init__(self, core: EngineCoreRequest) -> None:
        self.request_id = core.request_id
        self.params = core.params
        self.token_ids: list[int] = list(core.prompt_token_ids)
        self.num_prompt_tokens = len(core.prompt_token_ids)
        self.max_output_tokens = core.max_tokens
        self.eos_token_ids = frozenset(() if core.params.ignore_eos else core.eos_token_ids)
        self.arrival_time = core.arrival_time
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_in_flight = 0  # sampled on the device, not landed on the host yet
        self.block_table: list[int] = []
        self.block_hashes: list[bytes] = []  # one per full, committed block
        self.host_block_table: list[int] = []  # while swapped out
        self.finish_reason: str | None = None
        self.stop_reason: int | None = None
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache
        self.spec_token_ids: list[int] = []  # draft tokens to verify (speculative decoding)
        self.first_scheduled_time: float | None = None
        self.runner_knows = False  # the runner holds its state (new data sent, not dropped)
        self.grammar = None  # structured output: a GrammarState the landed tokens advance
        self.images = core.images  # sent to the runner with the request's data
        # [start, end) of each image's tokens: a prefill chunk never ends inside one
        self.image_spans = [(im.offset, im.offset + im.length) for im in core.images]
        self.lora_name = core.lora_name  # "" for the base model
        self.lora_id: int | None = None  # the loaded adapter's id and prefix-hash root (set by the core)
        self.lora_root: bytes | None = None

    def whole_images(self, n: int) -> int:
        """n tokens to compute from num_computed_tokens, cut back to the start of an image it
        would end inside, or (starting inside or at one) carried to the image's end."""
        start = self.num_computed_tokens
        end = start + n
        for lo, hi in self.image_spans:
            if lo < end < hi:
                end = lo if lo > start else hi
        return end - start

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids) + self.num_in_flight

    @property
    def priority(self) -> int:
        """Lower values are admitted and prefilled first (vLLM's priority)."""
        return self.params.priority

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) + self.num_in_flight - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def has_all_outputs(self) -> bool:
        """Its last output token is known or in flight: nothing left to compute."""
        return self.num_output_tokens >= self.max_output_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def stop_reason_for(self, token: int) -> str | None:
        """"stop" if token ends the request (a stop token or EOS), "length" at max_tokens."""
        params = self.params
        if token in params.stop_token_ids:
            self.stop_reason = token
            return "stop"
        if token in self.eos_token_ids:
            return "stop"
        if len(self.token_ids) - self.num_prompt_tokens >= self.max_output_tokens:
            return "length"
        return None


def adapter_fits(req: Request, running: list[Request], max_loras: int) -> bool:
    """Whether req's LoRA adapter (if any) has a slot: one running requests use, or a free one."""
    if not req.lora_id:
        return True
    ids = {r.lora_id for r in running if r.lora_id}
    return req.lora_id in ids or len(ids) < max_loras
