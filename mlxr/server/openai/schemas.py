"""Request bodies of the OpenAI routes. The ranges here are the first check (and what
/openapi.json advertises); SamplingParams validates again before the engine sees anything."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, Strict

from mlxr.server.text_fields import CheckedText

from mlxr.types import MAX_LOGPROBS, MAX_TOKENS_LIMIT, PRIORITY_LIMIT

MAX_N = 16  # choices per prompt; huge n is a memory attack [vLLM]
MAX_PROMPTS = 64  # prompts in one /v1/completions batch
MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit; LangChain's OpenAIEmbeddings sends 1,000 a request
MAX_EMBEDDING_TOKENS = 300_000  # OpenAI's limit on the inputs' tokens together
MAX_STOP = 16
MAX_LOGIT_BIAS = 1024
SEED_MIN, SEED_MAX = -(1 << 63), (1 << 63) - 1

TokenId = Annotated[int, Field(ge=0, le=(1 << 31) - 1)]
TokenIds = Annotated[list[TokenId], Field(min_length=1, max_length=1 << 20)]
MaxTokens = Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT)]
# vLLM's scheduling priority: lower values are admitted and prefilled first (docs/serving.md).
Priority = Annotated[int, Field(ge=-PRIORITY_LIMIT, le=PRIORITY_LIMIT)]


class _Body(CheckedText):
    # Unknown fields are ignored (clients send extras); NaN/Infinity are refused. Strict, as
    # OpenAI's server is: "5" is not an integer, "yes" or 1 not a boolean, true not token 1.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)


class StreamOptions(_Body):
    include_usage: bool = False


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: dict[str, Any] | None = None


class SamplingFields(_Body):
    """Fields shared by chat and completions, vLLM's extras included."""

    model: str | None = Field(None, max_length=512)
    max_tokens: MaxTokens | None = None
    temperature: float | None = Field(None, ge=0.0, le=100.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=MAX_N)
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(None, description="token id (as a string) -> bias in [-100, 100]")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    top_k: int | None = Field(None, ge=-1, le=(1 << 31) - 1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=100.0)
    min_tokens: int = Field(0, ge=0, le=MAX_TOKENS_LIMIT)
    stop_token_ids: Annotated[list[TokenId], Field(max_length=256)] | None = None
    ignore_eos: bool = False
    priority: Priority = 0
    # Structured output (vLLM's extras; response_format below): see openai/structured.py.
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # vLLM's fields for what this server does not do: only their no-op values are taken
    # (prompts.check_unsupported), so a client that asks for more is told rather than ignored.
    best_of: int | None = Field(None, ge=1, le=MAX_N)
    use_beam_search: bool = False
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)  # vLLM's: each prompt token's logprob


class ContentPart(_Body):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    type: str
    text: str | None = None


class ChatMessage(_Body):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class FunctionDef(_Body):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # OpenAI strict mode for the parameters (strict_schema.py)


class Tool(_Body):
    type: Literal["function"] = "function"
    function: FunctionDef


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1, max_length=4096)
    max_completion_tokens: MaxTokens | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[Tool] | None = Field(None, max_length=512)
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    add_generation_prompt: bool = True
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    thinking_token_budget: int | None = None  # vLLM's extra: reasoning tokens before the answer is forced
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's extra: variables for the template
    chat_template: str | None = None  # vLLM's extra, refused: the model's own template renders


def _prompts(most: int):
    """One text, a list of texts, token ids, or lists of token ids: at most `most` prompts."""
    return (
        str
        | Annotated[list[str], Field(min_length=1, max_length=most)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1, max_length=most)]
    )


Prompt = _prompts(MAX_PROMPTS)
EmbeddingInput = _prompts(MAX_EMBEDDING_INPUTS)


class CompletionRequest(SamplingFields):
    prompt: Prompt
    # 0 with echo: the prompt alone, scored (legacy OpenAI; lm-evaluation-harness sends it)
    max_tokens: Annotated[int, Field(ge=0, le=MAX_TOKENS_LIMIT)] | None = 16
    logprobs: Annotated[int, Strict()] | None = Field(None, ge=0, le=MAX_LOGPROBS)  # false is not 0
    echo: bool = False
    suffix: str | None = None
    thinking_token_budget: int | None = None  # vLLM's extra: reasoning tokens before the end marker is forced


class EmbeddingRequest(_Body):
    model: str | None = Field(None, max_length=512)
    input: EmbeddingInput
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None
    # Extensions for encoder models (llama.cpp's --pooling names; none and rank give no vector)
    pooling: str | None = Field(None, max_length=16)
    normalize: bool | None = None
