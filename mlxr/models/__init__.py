"""Every architecture MLXR runs: its declaration (models/arch.py) and its model class."""
from __future__ import annotations

from torch import nn

from mlxr.errors import UnsupportedModelError
from mlxr.model_config import ModelArgs
from mlxr.models import (bert, gemma2, gemma3, gemma3_vlm, gemma4, gemma_embedding, gpt_oss, granite, idefics3, llava, llama,
                         mistral, mixtral, nomic_bert, olmo2, phi3, qwen2, qwen2_5_vl, qwen3, qwen3moe, qwen35, qwen35moe,
                         xlm_roberta)
from mlxr.models.arch import Architecture

# Mixtral before Llama: both are GGUF "llama", Mixtral claims the files with experts.
_MODULES = (mixtral, llama, mistral, qwen2, qwen3, qwen3moe, gemma2, gemma3, granite, olmo2, phi3, llava, idefics3, gpt_oss, gemma4,
            qwen35, qwen35moe, qwen2_5_vl)
# Encoders (embedding and reranking models): no KV cache, loaded by loader/encoder_model.py.
_ENCODER_MODULES = (bert, xlm_roberta, nomic_bert, gemma_embedding)
ENCODERS = frozenset(m.ARCH.name for m in _ENCODER_MODULES)
_MODULES += _ENCODER_MODULES
ARCHITECTURES: dict[str, Architecture] = {m.ARCH.name: m.ARCH for m in _MODULES}
MODELS: dict[str, type[nn.Module]] = {m.ARCH.name: m.MODEL for m in _MODULES}
# The vision-language model of ModelArgs that carry a tower (args.vision), by its projector (a
# Llama GGUF with an Idefics3 mmproj is Idefics3).
VISION_MODELS: dict[str, type[nn.Module]] = {"gemma3": gemma3_vlm.MODEL, "llava": llava.MODEL,
                                             "idefics3": idefics3.MODEL, "qwen2_5_vl": qwen2_5_vl.MODEL}
# The architectures whose config.json may carry a tower (a vision_config).
VISION_ARCHS = frozenset(a.name for a in ARCHITECTURES.values() if a.hf_vision is not None)
_BY_HF_TYPE = {t: a for a in ARCHITECTURES.values() for t in a.hf_model_types}
_BY_GGUF_ARCH: dict[str, list[Architecture]] = {}
for _arch in ARCHITECTURES.values():
    for _name in _arch.gguf_archs:
        _BY_GGUF_ARCH.setdefault(_name, []).append(_arch)


def architecture(name: str) -> Architecture:
    """The declaration of a canonical name, an HF model_type or a GGUF architecture."""
    arch = ARCHITECTURES.get(name) or _BY_HF_TYPE.get(name) or (_BY_GGUF_ARCH.get(name) or [None])[-1]
    if arch is None:
        raise UnsupportedModelError(f"unsupported model architecture {name!r} "
                                    f"(supported: {', '.join(sorted(_BY_HF_TYPE))})")
    return arch


def hf_architecture(config: dict) -> Architecture:
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if isinstance(config, dict) and gemma_embedding.is_embedding_gemma(config):
        return gemma_embedding.ARCH
    if not isinstance(model_type, str) or model_type not in _BY_HF_TYPE:
        raise UnsupportedModelError(f"model_type {model_type!r} is not supported "
                                    f"(supported: {', '.join(sorted(_BY_HF_TYPE))})")
    return _BY_HF_TYPE[model_type]


def gguf_architecture(metadata: dict) -> Architecture:
    """The declaration claiming a GGUF file (the first whose gguf_match accepts its metadata)."""
    name = metadata.get("general.architecture")
    for arch in _BY_GGUF_ARCH.get(name, []) if isinstance(name, str) else []:
        if arch.gguf_match(metadata):
            return arch
    raise UnsupportedModelError(f"GGUF architecture {name!r} is not supported "
                                f"(supported: {', '.join(sorted(_BY_GGUF_ARCH))})")


def canonical_model_type(name: str) -> str:
    return architecture(name).name


def is_encoder(name: str) -> bool:
    """Whether an architecture (canonical, HF or GGUF name) is an encoder."""
    return architecture(name).name in ENCODERS


def build_model(args: ModelArgs) -> nn.Module:
    name = canonical_model_type(args.model_type)
    if args.vision is not None:
        if args.vision.projector not in VISION_MODELS:
            raise UnsupportedModelError(f"{name} takes no images; its config.json has a vision_config")
        return VISION_MODELS[args.vision.projector](args)
    return MODELS[name](args)
