"""Request bodies of the Ollama API (pydantic, so the OpenAPI schema documents them)."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, Strict, model_validator

from mlxr.server.ollama.options import Int, Options
from mlxr.server.text_fields import CheckedText

# Strict: JSON true is not one second.
KeepAlive = Annotated[float, Strict()] | Annotated[str, Strict()] | None
MAX_EMBED_INPUTS = 256  # each is a forward pass on the engine thread
# "json" or a JSON schema: decoding is constrained to it (see structured.py).
Format = Literal["", "json"] | dict[str, Any] | None
# vLLM's `structured_outputs` (regex, choice, grammar, json): an extra beside Ollama's `format`.
Constraint = dict[str, Any] | None


class _Body(CheckedText):
    # Strict, as Ollama's Go server is: "yes" is no boolean, "5" no number (an integer still
    # takes a whole number written as a float: Int).
    model_config = ConfigDict(strict=True)


class _Named(_Body):
    """Older clients send `name` where newer ones send `model`; accept either."""

    model: str = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _name_alias(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("model") and data.get("name"):
            return {**data, "model": data["name"]}
        return data


class GenerateRequest(_Body):
    model: str = Field(min_length=1)
    prompt: str = ""
    suffix: str = ""
    system: str | None = None
    template: str | None = None
    context: list[Int] | None = None
    raw: bool = False
    format: Format = None
    structured_outputs: Constraint = None
    options: Options | None = None
    stream: bool = True
    keep_alive: KeepAlive = None
    images: list[str] | None = None
    think: bool | str | None = None
    logprobs: bool | None = None
    top_logprobs: Int | None = None
    truncate: bool | None = None  # None/true: cut a prompt over num_ctx to fit; false: 400


class ToolFunction(_Body):
    model_config = ConfigDict(extra="allow")

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)  # an object, unlike OpenAI's string


class ToolCall(_Body):
    model_config = ConfigDict(extra="allow")

    function: ToolFunction


class ChatMessage(_Body):
    role: str = Field(min_length=1)
    content: str | None = ""
    images: list[str] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None
    thinking: str | None = None


class ChatRequest(_Body):
    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    format: Format = None
    structured_outputs: Constraint = None
    options: Options | None = None
    stream: bool = True
    keep_alive: KeepAlive = None
    think: bool | str | None = None
    logprobs: bool | None = None
    top_logprobs: Int | None = None
    truncate: bool | None = None  # None/true: cut a prompt over num_ctx to fit; false: 400


class EmbedRequest(_Body):
    model: str = Field(min_length=1)
    input: str | Annotated[list[str], Field(max_length=MAX_EMBED_INPUTS)] = ""
    truncate: bool | None = None
    options: Options | None = None
    keep_alive: KeepAlive = None
    dimensions: Int | None = Field(default=None, ge=1)


class EmbeddingsRequest(_Body):
    model: str = Field(min_length=1)
    prompt: str = ""
    options: Options | None = None
    keep_alive: KeepAlive = None


class ShowRequest(_Named):
    verbose: bool = False


class DeleteRequest(_Named):
    pass


class CopyRequest(_Body):
    source: str = Field(min_length=1)
    destination: str = Field(min_length=1)


class PullRequest(_Named):
    insecure: bool = False
    stream: bool = True


class CreateRequest(_Named):
    """`from` is a GGUF file or Hugging Face directory on the server machine, or an existing
    model name. Blob uploads (`files`), quantizing and Modelfile settings are not supported."""

    model_config = ConfigDict(populate_by_name=True)

    from_: str | None = Field(default=None, alias="from")
    files: dict[str, str] | None = None
    adapters: dict[str, str] | None = None
    quantize: str | None = None
    template: str | None = None
    system: str | None = None
    license: str | list[str] | None = None
    parameters: dict[str, Any] | None = None
    messages: list[dict[str, Any]] | None = None
    stream: bool = True
