"""Typed errors. Each carries the HTTP status the server maps it to."""
from __future__ import annotations


class MLXRError(Exception):
    """Base of every error a user can cause."""

    status: int = 500
    kind: str = "internal_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidParameterError(MLXRError, ValueError):
    """A request or sampling field has an invalid value; `param` names the field."""

    status = 400
    kind = "invalid_request_error"

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}", param=param)


class ContextLengthError(InvalidParameterError):
    """The prompt (plus what must be generated) does not fit in the model's context."""

    def __init__(
        self, prompt_tokens: int, limit: int, max_tokens: int | None = None, param: str = "prompt"
    ) -> None:
        if max_tokens is None:
            msg = f"the prompt has {prompt_tokens} tokens but the context length is {limit}"
        else:
            msg = (
                f"the prompt has {prompt_tokens} tokens and max_tokens is {max_tokens}, "
                f"together {prompt_tokens + max_tokens}, but the context length is {limit}"
            )
            param = "max_tokens"
        super().__init__(param, msg)
        self.prompt_tokens = prompt_tokens
        self.limit = limit


class ModelNotFoundError(MLXRError):
    status = 404
    kind = "not_found_error"


class ModelFormatError(MLXRError):
    """A model file is truncated, corrupted or hostile."""

    status = 400
    kind = "invalid_model_file"


class AdapterError(MLXRError):
    """A LoRA adapter that cannot be served: a bad file, a bound it passes, or a base it does not fit."""

    status = 400
    kind = "invalid_lora_adapter"


class UnsupportedModelError(MLXRError):
    """A well-formed model file whose architecture or tensor type we do not support."""

    status = 400
    kind = "unsupported_model"


class TemplateError(MLXRError):
    """A chat template failed to render."""

    status = 400
    kind = "invalid_request_error"


class CapacityError(MLXRError):
    """A request can never fit in the KV cache."""

    status = 400
    kind = "invalid_request_error"


class OverloadedError(MLXRError):
    """The waiting queue is full; try again later."""

    status = 503
    kind = "overloaded_error"


class EngineError(MLXRError):
    """Running a step failed for this request."""

    status = 500
    kind = "internal_error"


class EngineDeadError(MLXRError):
    """The engine core's process stopped; the model reloads on the next request."""

    status = 503
    kind = "engine_dead_error"


class DownloadError(MLXRError):
    """A pull could not fetch or verify a model (the hub or index failed, a checksum differed)."""

    status = 502
    kind = "download_error"
