"""Modelfile settings (SYSTEM, TEMPLATE, PARAMETER, MESSAGE) of /api/create: checked when a model
is created, applied to each /api/generate and /api/chat request (the request's own system,
template and options win), and shown by /api/show.

TEMPLATE is a Go template of the subset prompts.render_go_template renders; it shapes
/api/generate prompts. /api/chat keeps the model's chat template."""
from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from mlxr.errors import InvalidParameterError
from mlxr.registry.settings import ModelSettings, checked_settings
from mlxr.server.ollama.options import Options
from mlxr.server.ollama.prompts import render_go_template
from mlxr.server.ollama.schemas import ChatMessage, ChatRequest, CreateRequest, GenerateRequest


def settings_of(body: CreateRequest, base: ModelSettings | None = None, adapter: str | None = None) -> ModelSettings:
    """The request's settings over `base` (a model created `from` another keeps its settings);
    adapter: the LoRA adapter's path its `adapters` made (ADAPTER)."""
    parameters = body.parameters
    if parameters is not None:
        try:
            options = Options.model_validate(parameters)
        except ValidationError as e:
            raise InvalidParameterError("parameters", _first_problem(e)) from None
        for name in options.model_extra or {}:  # a request's unknown option is logged; a model's is kept
            raise InvalidParameterError(f"parameters.{name}", f"unknown Modelfile parameter {name!r}")
    new = checked_settings(body.system, body.template, parameters, body.messages)
    if new.template is not None:
        render_go_template(new.template, "", "")  # a 400 now, not at every request
    base = base or ModelSettings()
    return ModelSettings(
        new.system or base.system, new.template or base.template,
        {**base.parameters, **new.parameters}, new.messages or base.messages, adapter or base.adapter)


def for_generate(body: GenerateRequest, settings: ModelSettings) -> GenerateRequest:
    update: dict[str, Any] = {"options": _options(body.options, settings)}
    if body.system is None and settings.system:
        update["system"] = settings.system
    if body.template is None and settings.template:
        update["template"] = settings.template
    return body.model_copy(update=update)


def for_chat(body: ChatRequest, settings: ModelSettings) -> ChatRequest:
    prefix = [ChatMessage(**m) for m in settings.messages]
    if settings.system and not any(m.role == "system" for m in body.messages):
        prefix.insert(0, ChatMessage(role="system", content=settings.system))
    return body.model_copy(update={"options": _options(body.options, settings),
                                   "messages": [*prefix, *body.messages]})


def show_fields(settings: ModelSettings) -> dict[str, Any]:
    """What /api/show adds for a model with settings, and the Modelfile lines that say so."""
    fields: dict[str, Any] = {}
    lines = []
    if settings.system:
        fields["system"] = settings.system
        lines.append(f'SYSTEM """{settings.system}"""')
    if settings.template:
        fields["template"] = settings.template
    if settings.messages:
        fields["messages"] = list(settings.messages)
        lines += [f'MESSAGE {m["role"]} """{m["content"]}"""' for m in settings.messages]
    params = settings.parameters_text()
    lines += [f"PARAMETER {line}" for line in params.splitlines()]
    if settings.adapter:
        lines.append(f"ADAPTER {settings.adapter}")
    return {"fields": fields, "parameters": params, "lines": lines}


def _options(options: Options | None, settings: ModelSettings) -> Options | None:
    if not settings.parameters:
        return options
    given = options.model_dump(exclude_none=True) if options is not None else {}
    return Options.model_validate({**settings.parameters, **given})


def _first_problem(e: ValidationError) -> str:
    err = e.errors()[0]
    return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
