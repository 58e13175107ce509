"""Request -> prompt token ids: chat templates, raw prompts, Ollama's `template` and `context`.

Ollama's `template` is a Go template. We render only its simple subset: `{{ .System }}`,
`{{ .Prompt }}`, `{{ .Response }}` (generation starts there), `{{ if .X }}...{{ end }}` and
the `{{-`/`-}}` trim markers. Anything else is a 400 rather than a silently different prompt.
"""
from __future__ import annotations

import re
from typing import Any

import msgspec

from mlxr.errors import InvalidParameterError
from mlxr.model_config import VisionArgs
from mlxr.server.chat_plan import ChatPlan, plan_chat
from mlxr.server.images import base64_image
from mlxr.server.ollama.schemas import ChatMessage, ChatRequest, GenerateRequest
from mlxr.server.prompt_work import check_prompt_chars, max_prompt_chars, prompt_chars_cap
from mlxr.types import ImagePrompt, ImagePromptIds
from mlxr.vision.image_prompt import check_takes_images, image_prompt_ids

_ACTION = re.compile(r"\{\{(.*?)\}\}", re.S)
_FIELD = re.compile(r"\.(System|Prompt|Response)")
_IF = re.compile(r"if\s+\.(System|Prompt|Response)")


def generate_prompt_ids(req: GenerateRequest, tokenizer: Any, context_length: int,
                        vision: VisionArgs | None = None) -> list[int]:
    """The prompt's ids; its rendered text is bounded (prompt_work.max_prompt_chars) before
    it is tokenized, and an Ollama template while it renders. With images, the ids carry them
    (ImagePromptIds): their markers go before the prompt, as Ollama places them."""
    if req.suffix:
        raise InvalidParameterError("suffix", "fill-in-the-middle (insert) is not supported")
    images = _images(req.images, "images", vision)
    names = tuple(f"images[{i}]" for i in range(len(images)))
    if images:
        req = req.model_copy(update={"prompt": vision.image_marker * len(images) + req.prompt})
    prefix = list(req.context or [])
    if req.raw:
        text, specials = req.prompt, True
    elif req.template:
        limit = max_prompt_chars(tokenizer, context_length)
        text, specials = render_go_template(req.template, req.system or "", req.prompt, limit), True
    elif tokenizer.chat_template is not None:  # a base model's prompt goes in raw, as Ollama's does
        system = [{"role": "system", "content": req.system}] if req.system else []
        messages = [*system, {"role": "user", "content": req.prompt}]
        text, specials = tokenizer.apply_chat_template(messages, add_generation_prompt=True), False
    else:
        text, specials = (f"{req.system}\n\n{req.prompt}" if req.system else req.prompt), True
    check_prompt_chars(tokenizer, context_length, text, "prompt")
    # A continuation (context) already starts with BOS.
    if images:
        ids = image_prompt_ids(ImagePrompt(text, images, specials and not prefix, names), vision, tokenizer)
        return after_context(prefix, ids)
    return prefix + tokenizer.encode(text, add_special_tokens=specials and not prefix)


def _images(images: list[str] | None, name: str, vision: VisionArgs | None) -> tuple[bytes, ...]:
    if not images:
        return ()
    check_takes_images(vision, len(images))
    return tuple(base64_image(b64, f"{name}[{i}]") for i, b64 in enumerate(images))


def after_context(prefix: list[int], ids: ImagePromptIds) -> ImagePromptIds:
    if not prefix:
        return ids
    moved = [msgspec.structs.replace(im, offset=im.offset + len(prefix)) for im in ids.images]
    return ImagePromptIds(prefix + list(ids), moved)


def chat_prompt_ids(req: ChatRequest, tokenizer: Any, context_length: int,
                    vision: VisionArgs | None = None) -> list[int]:
    return planned_ids(chat_plan(req, tokenizer, vision), tokenizer, context_length, chat_images(req, vision), vision)


def planned_ids(plan: ChatPlan, tokenizer: Any, context_length: int,
                images: tuple[tuple[bytes, ...], tuple[str, ...]] = ((), ()),
                vision: VisionArgs | None = None) -> list[int]:
    """The rendered chat prompt's ids, its characters bounded before it is tokenized; with
    images ((files, names) as chat_images gives them), ImagePromptIds (the template wrote a
    marker for each)."""
    check_prompt_chars(tokenizer, context_length, plan.prompt_text, "messages")
    files, names = images
    if files:
        return image_prompt_ids(ImagePrompt(plan.prompt_text, files, False, names), vision, tokenizer)
    return tokenizer.encode(plan.prompt_text, add_special_tokens=False)


THINK_LEVELS = frozenset({"low", "medium", "high", "true", "false", ""})  # Ollama's, and its strings


def chat_images(req: ChatRequest, vision: VisionArgs | None) -> tuple[tuple[bytes, ...], tuple[str, ...]]:
    """Every message's images in order, and their names (a text-only model refuses any)."""
    files: list[bytes] = []
    names: list[str] = []
    for i, m in enumerate(req.messages):
        found = _images(m.images, f"messages.{i}.images", vision)
        files += found
        names += [f"messages.{i}.images[{j}]" for j in range(len(found))]
    if files:
        check_takes_images(vision, len(files))
    return tuple(files), tuple(names)


def chat_plan(req: ChatRequest, tokenizer: Any, vision: VisionArgs | None = None) -> ChatPlan:
    """The rendered prompt with its tools and thinking (`think`: true, false, or a level)."""
    messages = [_template_message(m, i, vision) for i, m in enumerate(req.messages)]
    if isinstance(req.think, str) and req.think not in THINK_LEVELS:
        raise InvalidParameterError("think", f"is true, false or one of {sorted(THINK_LEVELS - {'', 'true', 'false'})}, "
                                             f"got {req.think!r}")
    thinking = None if req.think in (None, "") else req.think not in (False, "false")
    effort = req.think if req.think in ("low", "medium", "high") else None
    plan = plan_chat(tokenizer, messages, req.tools or None, thinking=thinking,
                     other_constraint=bool(req.format), effort=effort)
    if thinking and plan.markers is None and not plan.harmony:
        raise InvalidParameterError("think", f"{req.model!r} does not support thinking")
    return plan


def _template_message(message: ChatMessage, index: int, vision: VisionArgs | None) -> dict[str, Any]:
    content = message.content or ""
    if message.images:
        if vision is None:
            raise InvalidParameterError(f"messages.{index}.images", "this model takes text only; send no images")
        content = vision.image_marker * len(message.images) + content  # before the text, as Ollama puts them
    out: dict[str, Any] = {"role": message.role, "content": content}
    if message.tool_calls:
        out["tool_calls"] = [
            {"type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in message.tool_calls
        ]
    if message.tool_name:
        out["name"] = message.tool_name
    return out


def render_go_template(template: str, system: str, prompt: str, max_chars: int | None = None) -> str:
    """The template's text; past max_chars (a template may copy the prompt at each
    `{{ .Prompt }}`) a 400 as soon as the text grows past it, not after it is built."""
    limit = prompt_chars_cap() if max_chars is None else max_chars
    values = {"System": system, "Prompt": prompt, "Response": ""}
    parts = _split_actions(template)
    out: list[str] = []
    size = len(template)
    keep = [True]  # one entry per open `if`
    for i, part in enumerate(parts):
        if i % 2 == 0:
            out.append(part if all(keep) else "")
            continue
        field, cond = _FIELD.fullmatch(part), _IF.fullmatch(part)
        if field and field.group(1) == "Response" and all(keep):
            break  # generation continues from here
        if field:
            out.append(values[field.group(1)] if all(keep) else "")
            size += len(out[-1])
            if size > limit:
                raise InvalidParameterError("template", f"renders more than {limit} characters "
                                                        f"(the prompt's bound; MAX_PROMPT_CHARS {prompt_chars_cap()})")
        elif cond:
            keep.append(bool(values[cond.group(1)]))
        elif part == "end" and len(keep) > 1:
            keep.pop()
        else:
            raise InvalidParameterError(
                "template", f"unsupported Go template action {{{{ {part} }}}}: only .System, "
                ".Prompt, .Response and if/end are rendered")
    return "".join(out)


def _split_actions(template: str) -> list[str]:
    """Alternating text and action parts, with the `{{-` / `-}}` whitespace trimmed."""
    parts = _ACTION.split(template)
    for i in range(1, len(parts), 2):
        action = parts[i]
        if action.startswith("-"):
            parts[i - 1] = parts[i - 1].rstrip()
        if action.endswith("-"):
            parts[i + 1] = parts[i + 1].lstrip()
        parts[i] = action.strip("-").strip()
    return parts
