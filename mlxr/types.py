"""Records that cross package seams: sampling parameters and request outputs."""
from __future__ import annotations

import math
from dataclasses import dataclass

import msgspec

from mlxr.errors import InvalidParameterError

MAX_N = 64
MAX_LOGPROBS = 20
MAX_TOKENS_LIMIT = 1 << 20
PRIORITY_LIMIT = (1 << 31) - 1  # a request's priority lies in [-PRIORITY_LIMIT, PRIORITY_LIMIT]
MAX_STOP_STRINGS = 64  # each is matched on every token: bound the work one request can cost
MAX_STOP_LENGTH = 1024


def _check_range(name: str, value: float, lo: float, hi: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidParameterError(name, f"must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or not lo <= value <= hi:
        raise InvalidParameterError(name, f"must be in [{lo}, {hi}], got {value}")


def _check_int(name: str, value: int, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidParameterError(name, f"must be an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise InvalidParameterError(name, f"must be in [{lo}, {hi}], got {value}")


MAX_MARKER_CHARS = 64  # a reasoning marker (StructuredOutputsParams.reasoning)


@dataclass
class StructuredOutputsParams:
    """A constraint on what a request may generate (vLLM's `structured_outputs` shape): exactly
    one of a JSON schema, any JSON object, a regex, a choice of strings, or a Lark grammar."""

    json: dict | str | None = None  # a JSON schema (a dict or its JSON text)
    json_object: bool = False  # any JSON object
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # Lark / EBNF text
    # (start, end) markers: the reply may first reason between them, unconstrained, and the
    # constraint applies after; start "": the prompt opened the block. Set by the chat routes.
    reasoning: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        given = [self.json is not None, self.json_object, self.regex is not None,
                 self.choice is not None, self.grammar is not None]
        if sum(given) != 1:
            raise InvalidParameterError(
                "structured_outputs", "give exactly one of json, json_object, regex, choice, grammar")
        if self.reasoning is not None:
            start, end = self.reasoning
            if not end or len(start) > MAX_MARKER_CHARS or len(end) > MAX_MARKER_CHARS:
                raise InvalidParameterError("structured_outputs",
                                            f"reasoning markers must be 1 to {MAX_MARKER_CHARS} characters")


GREEDY_BELOW = 1e-5  # temperatures under this sample greedily (SamplingParams.greedy)


@dataclass
class SamplingParams:
    """How to sample one request (vLLM-shaped). temperature 0 (below 1e-5) means greedy."""

    n: int = 1
    max_tokens: int | None = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None  # each prompt token's logprob and this many alternatives
    logit_bias: dict[int, float] | None = None
    structured_outputs: StructuredOutputsParams | None = None
    speculative: bool = True  # False: this request never carries draft tokens (when the engine speculates)
    priority: int = 0  # vLLM's: lower values are admitted and prefilled first (engine/sched/budget.py)
    # vLLM's: special tokens left out of the text; False keeps them (harmony's channel markers)
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self._validate()

    def _validate(self) -> None:
        _check_int("n", self.n, 1, MAX_N)
        _check_int("priority", self.priority, -PRIORITY_LIMIT, PRIORITY_LIMIT)
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens, 1, MAX_TOKENS_LIMIT)
        _check_int("min_tokens", self.min_tokens, 0, MAX_TOKENS_LIMIT)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise InvalidParameterError("min_tokens", "must not exceed max_tokens")
        _check_range("temperature", self.temperature, 0.0, 100.0)
        _check_int("top_k", self.top_k, -1, 1 << 31)
        _check_range("top_p", self.top_p, 0.0, 1.0)
        if self.top_p == 0.0:
            raise InvalidParameterError("top_p", "must be in (0, 1]")
        _check_range("min_p", self.min_p, 0.0, 1.0)
        _check_range("repetition_penalty", self.repetition_penalty, 1e-6, 100.0)
        _check_range("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _check_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        if self.seed is not None:
            _check_int("seed", self.seed, -(1 << 63), (1 << 64) - 1)
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, 0, MAX_LOGPROBS)
        if self.prompt_logprobs is not None:
            _check_int("prompt_logprobs", self.prompt_logprobs, 0, MAX_LOGPROBS)
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidParameterError("stop", f"at most {MAX_STOP_STRINGS} stop strings")
        for s in self.stop:
            if not isinstance(s, str) or not s or len(s) > MAX_STOP_LENGTH:
                raise InvalidParameterError("stop", f"each stop string must be 1 to {MAX_STOP_LENGTH} characters")
        for t in self.stop_token_ids:
            _check_int("stop_token_ids", t, 0, 1 << 31)
        for tok, bias in (self.logit_bias or {}).items():
            _check_int("logit_bias", tok, 0, 1 << 31)
            _check_range("logit_bias", bias, -100.0, 100.0)

    @property
    def greedy(self) -> bool:
        # As vLLM: below 1e-5 is greedy. A smaller temperature would reach the device as 0 in
        # float32 (1e-300: every logit NaN, and token 0 drawn every step).
        return self.temperature < GREEDY_BELOW


@dataclass
class Logprob:
    """Log-probability of one token, with its rank (1 = most likely) and text."""

    logprob: float
    rank: int
    decoded: str = ""


# One dict per generated token: token id -> Logprob (the chosen token plus the top-N).
TokenLogprobs = dict[int, Logprob]


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    logprobs: list[TokenLogprobs] | None = None
    stop_reason: str | int | None = None


@dataclass
class RequestMetrics:
    """Wall-clock times (time.monotonic seconds) of one request's life."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None


@dataclass(slots=True)
class RequestOutput:
    """The state of one request: complete text, or (when streaming) the delta since last."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    error: str | None = None
    num_cached_tokens: int = 0
    # SamplingParams.prompt_logprobs: an entry per prompt token, None for the first
    prompt_logprobs: list[TokenLogprobs | None] | None = None


@dataclass(frozen=True)
class ImagePrompt:
    """A prompt with images (encoded files: PNG, JPEG, ...). text holds the model's image marker
    once per image, in order (a chat template writes them for image parts); a text with none
    gets them all in front. add_special_tokens: as the tokenizer's (False for a rendered chat
    template, which holds its BOS)."""

    text: str
    images: tuple[bytes, ...]
    add_special_tokens: bool = True
    names: tuple[str, ...] = ()  # how an error names each image (the request's field); () "images[i]"


class ImageInput(msgspec.Struct, array_like=True, frozen=True):
    """One image of a prompt: its preprocessed pixels and where its placeholder tokens sit."""

    digest: bytes  # SHA-256 of the image file's bytes: part of the prefix-cache key of its blocks
    offset: int  # the prompt position of its first placeholder token
    length: int  # its placeholder tokens
    pixels: bytes  # float32, C order, of `shape` ([channels, height, width])
    shape: list[int]


class ImagePromptIds(list):
    """A prompt with images made ready (mlxr/vision/image_prompt.py): its token ids, the image
    placeholders among them, and `images`, each image's pixels and position. A list of ids
    everywhere ids go (lengths, context accounting); the engine sends the images on."""

    def __init__(self, ids: list[int], images: list[ImageInput]) -> None:
        super().__init__(ids)
        self.images = images


class EngineStats(msgspec.Struct, array_like=True, frozen=True):
    """A snapshot of the engine, readable at any time (the server exports it). The engine core
    sends its part (the fields up to vision_encoder_calls; records.py's CoreOutputs);
    the frontend adds its own counts (num_aborted onwards)."""

    num_requests_running: int
    num_requests_waiting: int
    num_requests_swapped: int
    kv_blocks_total: int
    kv_blocks_used: int
    kv_blocks_cached: int
    prefix_cache_queried_tokens: int
    prefix_cache_hit_tokens: int
    num_preemptions: int
    max_model_len: int = 0  # the context the engine runs (the KV cache may cap the model's)
    device_bytes: int = 0  # weights and KV cache on the device
    runtime_compiles: int = 0  # kernels compiled after the engine's warm-up (each paused a step)
    # KV cache tiers: {"host"|"disk": {"hits", "bytes_read", "bytes_written", "blocks", ...}}
    kv_tiers: dict[str, dict[str, int]] = {}
    spec_num_drafts: int = 0  # speculative decoding: rows that carried drafts
    spec_num_draft_tokens: int = 0  # drafts offered
    spec_num_accepted_tokens: int = 0  # drafts kept
    spec_accepted_per_position: tuple[int, ...] = ()  # drafts kept at position j (0-based)
    # Of the spec_* counts, jump-forward's: structured-output rows whose drafts were the
    # grammar's forced tokens (a proposer's are the rest).
    jump_forward_drafts: int = 0
    jump_forward_draft_tokens: int = 0
    jump_forward_accepted_tokens: int = 0
    vision_encoder_calls: int = 0  # images run through a vision tower
    # The frontend's counts (each API process its own under --api-servers N).
    num_aborted: int = 0
    finished_by_reason: dict[str, int] = {}
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    # --data-parallel-size N: each replica's own figures by its index ("0".."N-1"): up, restarts,
    # running, waiting, load_tokens, kv_blocks_used/total, prefix hit/queried tokens, placed_<reason>.
    data_parallel: dict[str, dict[str, int]] = {}
    # LoRA adapters (vllm:lora_requests_info): resident slots, and the adapters of the requests
    # running and waiting, by name.
    max_lora: int = 0
    running_lora_adapters: tuple[str, ...] = ()
    waiting_lora_adapters: tuple[str, ...] = ()

    @property
    def spec_acceptance_rate(self) -> float:
        return self.spec_num_accepted_tokens / self.spec_num_draft_tokens if self.spec_num_draft_tokens else 0.0

    @property
    def kv_cache_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0
