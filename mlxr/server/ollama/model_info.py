"""Payloads of /api/tags, /api/ps and /api/show, built from registry records and the
models the server holds."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from mlxr.chat.reasoning import markers_for_template
from mlxr.chat.template import default_template_for
from mlxr.chat.tools import format_for_template
from mlxr.loader.sampling_defaults import SamplingDefaults
from mlxr.model_config import ModelArgs
from mlxr.server.model_manager import ServedModel
from mlxr.server.ollama.durations import expiry_text
from mlxr.vision.tiles import tile_count_bound


def hex_digest(record: Any) -> str:
    return record.digest.removeprefix("sha256:")


def tag_entry(record: Any) -> dict[str, Any]:
    return {
        "name": record.name,
        "model": record.name,
        "modified_at": record.modified_at,
        "size": record.size_bytes,
        "digest": hex_digest(record),
        "details": record.details,
    }


def ps_entry(served: ServedModel) -> dict[str, Any]:
    return tag_entry(served.record) | {
        "expires_at": expiry_text(served.expires_at),
        "size_vram": device_bytes(served),
        "context_length": served.context_length,
    }


def device_bytes(served: ServedModel) -> int:
    """Bytes of weights and KV cache in GPU memory (0 when the model runs on the CPU)."""
    return served.engine.stats().device_bytes if served.engine.on_gpu else 0


def read_model(record: Any) -> tuple[ModelArgs, str | None]:
    """Architecture and chat template from the model files, without loading the weights."""
    path = Path(record.path)
    if record.format == "gguf":
        from mlxr.formats.gguf import open_gguf
        from mlxr.models.model_args import args_from_gguf

        with open_gguf(path) as f:
            template = f.metadata.get("tokenizer.chat_template")
            args = args_from_gguf(f)
            if record.projector is not None:
                from mlxr.loader.mmproj_model import with_projector
                from mlxr.tokenizer.tokenizer import Tokenizer

                args, _ = with_projector(args, Tokenizer.from_gguf_metadata(f.metadata), record.projector, weights=False)
            return args, template if isinstance(template, str) else None
    from mlxr.formats.json_file import check_text_file
    from mlxr.loader.hf_model import read_config, with_vision
    from mlxr.models.model_args import args_from_hf
    from mlxr.tokenizer.tokenizer import Tokenizer

    check_text_file(path / "chat_template.jinja")
    config = read_config(path)
    return with_vision(args_from_hf(config), config, path), Tokenizer.from_hf_dir(path).chat_template


def model_info(record: Any, args: ModelArgs) -> dict[str, Any]:
    arch = record.architecture
    info: dict[str, Any] = {
        "general.architecture": arch,
        "general.parameter_count": record.parameter_count,
        "general.file_type": record.quantization,
        f"{arch}.context_length": args.max_position_embeddings,
        f"{arch}.embedding_length": args.hidden_size,
        f"{arch}.block_count": args.num_hidden_layers,
        f"{arch}.feed_forward_length": args.intermediate_size,
        f"{arch}.attention.head_count": args.num_attention_heads,
        f"{arch}.attention.head_count_kv": args.num_key_value_heads,
        f"{arch}.attention.key_length": args.head_dim,
        f"{arch}.attention.value_length": args.head_dim,
        f"{arch}.attention.layer_norm_rms_epsilon": args.rms_norm_eps,
        f"{arch}.rope.freq_base": args.rope_theta,
        f"{arch}.vocab_size": args.vocab_size,
    }
    if args.sliding_window:
        info[f"{arch}.attention.sliding_window"] = args.sliding_window
    if args.vision is not None:
        info |= vision_info(arch, args.vision)
    return info


def vision_info(arch: str, vision: Any) -> dict[str, Any]:
    """The tower's shape under Ollama's `{arch}.vision.*` keys, and the image tokens a prompt
    gets for each image (the web UI's vision playground shows it); a tiled model's (Idefics3)
    count varies with the image, so it says the tokens of one tile and the most tiles instead."""
    info = {
        f"{arch}.vision.block_count": vision.num_hidden_layers,
        f"{arch}.vision.embedding_length": vision.hidden_size,
        f"{arch}.vision.attention.head_count": vision.num_attention_heads,
        f"{arch}.vision.image_size": vision.image_size,
        f"{arch}.vision.patch_size": vision.patch_size,
    }
    factor = vision.preprocess.resize_factor
    if factor:  # Qwen2.5-VL: as many tokens as the resized image's area gives, up to max_pixels
        return info | {"mlxr.vision.max_tokens_per_image": vision.preprocess.max_pixels // factor**2}
    if not vision.tiled:
        return info | {"mlxr.vision.tokens_per_image": vision.tokens_per_image}
    return info | {"mlxr.vision.tokens_per_tile": vision.tokens_per_image,
                   "mlxr.vision.max_tiles": tile_count_bound(vision.preprocess.tiling)}


def capabilities(template: str, args: ModelArgs | None = None, chat_model: bool = False) -> list[str]:
    """What Ollama's /api/show reports from a model's template: a decoder generates
    ("completion"), "vision" with a vision tower, "tools" where the template renders tools itself
    (a known tool-call format) or the model is a chat model (a template of its own), whose tools
    the generic format describes in the system prompt and whose `<tool_call>` lines it reads
    (llm-ollama offers tools only to a model that reports them); "thinking" where it knows
    reasoning markers. An encoder only embeds ("embedding", Ollama's word) or, with a
    classification head, reranks ("rerank")."""
    if args is not None and args.extra.get("encoder"):
        return ["rerank"] if args.extra.get("num_labels") else ["embedding"]
    vision = args is not None and args.vision is not None
    found = ["completion"]
    if vision:
        found.append("vision")
    if format_for_template(template).renders_tools or chat_model:
        found.append("tools")
    if markers_for_template(template) is not None:
        found.append("thinking")
    return found


def show_payload(record: Any, args: ModelArgs, template: str | None, context_length: int,
                 settings: dict[str, Any] | None = None, sampling: SamplingDefaults | None = None) -> dict[str, Any]:
    """`settings`: modelfile.show_fields of the record's Modelfile settings; `sampling`: the
    model's sampling defaults in force (shown in `parameters` and model_info)."""
    settings = settings or {"fields": {}, "parameters": "", "lines": []}
    sampling = sampling or SamplingDefaults()
    fields = settings["fields"]
    chat_template = template or default_template_for(record.architecture) or ""
    source = template_origin(fields.get("template") or template, record.architecture)
    template = fields.get("template") or chat_template
    own = {k: v for k, v in sampling.values.items() if sampling.sources.get(k) != "Modelfile"}
    defaults = SamplingDefaults(own).parameters_text()  # the Modelfile's own lines follow
    parameters = "\n".join(p for p in (defaults, settings["parameters"], f"num_ctx {context_length}") if p)
    modelfile = f"# Modelfile generated by mlxr\nFROM {record.path}\n"
    if template:
        modelfile += f'TEMPLATE """{template}"""\n'
    modelfile += "".join(f"{line}\n" for line in settings["lines"])
    modelfile += f"PARAMETER num_ctx {context_length}\n"
    return {
        **fields,
        "modelfile": modelfile,
        "parameters": parameters,
        "template": template,
        "details": record.details,
        "model_info": model_info(record, args) | {"mlxr.chat_template": source,
                                                  "mlxr.sampling_defaults": dict(sampling.values),
                                                  "mlxr.sampling_sources": dict(sampling.sources)},
        "capabilities": capabilities(chat_template, args, chat_model=source == "model"),  # /api/chat keeps it
        "modified_at": record.modified_at,
    }


def template_origin(own: str | None, architecture: str) -> str:
    """"model": the files (or the Modelfile) carry a chat template; "built-in": a base model
    that /api/chat renders with MLXR's template for its family; "none": no chat at all.
    /api/generate sends a prompt raw unless it is "model"."""
    if own:
        return "model"
    return "built-in" if default_template_for(architecture) else "none"
