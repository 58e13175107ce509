"""The engine core's records: what crosses between the frontend and the core, and between the
scheduler and the model runner. Ids and counts only, encoded with msgspec (never pickle), so
every one of them can cross a process boundary. Pure Python: no torch here."""
from __future__ import annotations

import msgspec

from mlxr.types import EngineStats, ImageInput, SamplingParams  # noqa: F401 - ImageInput: part of the requests


class TokenLogprob(msgspec.Struct, array_like=True, frozen=True):
    """One sampled token's figures under the raw logits: its logprob and rank, and the top
    alternatives as (token id, logprob)."""

    token_id: int
    logprob: float
    rank: int
    top: list[tuple[int, float]] = []


# --- frontend -> core ------------------------------------------------------------------------
class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True):
    """One sequence to generate (the frontend splits a request of n samples into n of these)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams  # params.n is 1 here; seed already offset per sample
    max_tokens: int  # the effective limit (the context's room when the user gave none)
    eos_token_ids: list[int]
    arrival_time: float
    images: list[ImageInput] = []  # in prompt order, their spans disjoint
    lora_name: str = ""  # a LoRA adapter the engine has loaded; "": the base model


# --- core -> frontend ------------------------------------------------------------------------
class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    """What one request got in one step: new token ids (EOS and stop tokens included), their
    logprobs when asked for, and why it finished when it did."""

    request_id: str
    new_token_ids: list[int] = []
    new_logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | None = None  # the stop token id that ended it
    num_cached_tokens: int = 0
    first_scheduled_time: float | None = None  # sent once, in the step that first ran it
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


# --- scheduler -> runner ---------------------------------------------------------------------
class NewRequestData(msgspec.Struct, array_like=True, omit_defaults=True):
    """A request the runner has not seen (or must see anew after preemption): all its known
    tokens once; later steps send counts and new block ids only."""

    request_id: str
    token_ids: list[int]  # prompt + outputs known so far
    num_prompt_tokens: int
    params: SamplingParams
    eos_token_ids: list[int]
    block_ids: list[int]
    images: list[ImageInput] = []
    lora_id: int = 0  # the core's id of its LoRA adapter; 0: the base model


class SchedulerOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    """One step: the rows in order (request id, tokens to compute from num_computed_tokens on),
    new requests' data, block changes, and requests the runner must forget."""

    request_ids: list[str] = []
    num_scheduled_tokens: list[int] = []
    num_computed_tokens: list[int] = []  # each row's first position this step
    new_requests: list[NewRequestData] = []
    new_block_ids: dict[str, list[int]] = {}  # appended to a known request's table
    replaced_block_tables: dict[str, list[int]] = {}  # copy-on-write replaced a block
    finished_request_ids: list[str] = []  # finished or aborted since the last step
    preempted_request_ids: list[str] = []  # dropped by the runner; resent as new when resumed
    blocks_to_copy: list[tuple[int, int]] = []
    blocks_to_swap_out: list[tuple[int, int]] = []  # (device, host)
    blocks_to_swap_in: list[tuple[int, int]] = []  # (host, device)
    # Extension slots: draft tokens per row (speculative decoding) and a packed token bitmask
    # (structured output), one row of ceil(vocab / 32) int32 words per sampled position.
    spec_token_ids: dict[str, list[int]] = {}
    grammar_bitmask: bytes | None = None
    # Hybrid models' prefix caching: (request id, checkpoint) whose state a row resumes from
    # before the step, and whose state after the step a row keeps (kv/state_checkpoints.py).
    state_restores: list[tuple[str, int]] = []
    state_saves: list[tuple[str, int]] = []
    state_swap_outs: list[tuple[str, int]] = []  # preempted rows' states kept before the runner forgets them

    @property
    def num_batched_tokens(self) -> int:
        return sum(self.num_scheduled_tokens)

    @property
    def is_empty(self) -> bool:
        return not self.request_ids


# --- runner -> scheduler ---------------------------------------------------------------------
class ModelRunnerOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    """The rows that sampled, in order, each with one or more sampled ids (more than one once
    draft tokens are verified) and their logprobs when the request asked for them."""

    request_ids: list[str] = []
    sampled_token_ids: list[list[int]] = []
    logprobs: list[list[TokenLogprob] | None] | None = None


# --- the core process's messages (core_proc.py) ------------------------------------------------
class AddRequests(msgspec.Struct, tag=True, array_like=True):
    requests: list[EngineCoreRequest]


class AbortRequests(msgspec.Struct, tag=True, array_like=True):
    request_ids: list[str]


class Embed(msgspec.Struct, tag=True, array_like=True):
    call_id: int
    token_ids: list[int]


class PromptLogprobs(msgspec.Struct, tag=True, array_like=True):
    """Score a prompt: each token's logprob given those before it, with `top` alternatives."""

    call_id: int
    token_ids: list[int]
    top: int
    first: int = 0  # the first position whose next token is scored


class LoRACall(msgspec.Struct, tag=True, array_like=True):
    """Load ("load", name, path), unload ("unload", name) or list ("list") the core's LoRA adapters."""

    call_id: int
    op: str
    name: str = ""
    path: str = ""


class Shutdown(msgspec.Struct, tag=True, array_like=True):
    pass


class Hello(msgspec.Struct, tag=True, array_like=True):
    """A client that just connected asks for CoreReady on its channel (a core serving several
    API processes, or one restarted under them, cannot know when each listens)."""


CoreInput = AddRequests | AbortRequests | Embed | PromptLogprobs | LoRACall | Shutdown | Hello


class CoreReady(msgspec.Struct, tag=True, array_like=True):
    stats: EngineStats
    on_gpu: bool
    pid: int = 0  # the core process, which a client that did not start it watches


class CoreOutputs(msgspec.Struct, tag=True, array_like=True):
    outputs: list[EngineCoreOutput]
    stats: EngineStats | None  # a snapshot now and then, and whenever a request finished


class Reply(msgspec.Struct, tag=True, array_like=True, omit_defaults=True):
    call_id: int
    vector: list[float] | None = None
    error: str | None = None  # "OverloadedError: ..." and the like
    logprobs: list[TokenLogprob] | None = None
    names: list[str] | None = None  # a LoRACall's adapters loaded after it


class CoreFailed(msgspec.Struct, tag=True, array_like=True):
    error: str  # the core could not start or stopped with this


CoreMessage = CoreReady | CoreOutputs | Reply | CoreFailed

_ENCODER = msgspec.msgpack.Encoder()


def encode(record: msgspec.Struct) -> bytes:
    return _ENCODER.encode(record)


def decoder(kind) -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(kind)
