"""File on disk -> (model, tokenizer, args): the one place that knows both formats and models."""
from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from mlxr.errors import ModelFormatError, UnsupportedModelError
from mlxr.layers.fused_linear import fuse_projections
from mlxr.layers.linear import store_weights_as
from mlxr.layers.quant_linear import PackedWeight, QuantLinear, install_packed
from mlxr.loader.resolve import ModelSource, resolve_model
from mlxr.model_config import ModelArgs
from mlxr.models import build_model, canonical_model_type
from mlxr.tokenizer.tokenizer import Tokenizer

log = logging.getLogger(__name__)
LoadProgress = Callable[[int, int], None]  # (tensors placed, tensors in the checkpoint)


@dataclass
class LoadedModel:
    source: ModelSource
    args: ModelArgs
    model: nn.Module
    tokenizer: Tokenizer
    dtype: torch.dtype  # activations and KV cache
    device: torch.device
    weight_dtype: torch.dtype  # storage of the linear and embedding weights not quantized
    quantization: str = "none"  # "gguf": GGUF blocks kept; "fp8": E4M3 weights; "none"


def default_dtypes(device: torch.device) -> tuple[torch.dtype, torch.dtype]:
    """(activation dtype, weight storage dtype) when the user names neither. On CPU, fp32
    activations with fp16 weights: decode reads half the bytes, fp16 GEMV is fast, and
    fp32 activations avoid the fp16 overflows of models such as Gemma."""
    if device.type == "cuda":
        return torch.bfloat16, torch.bfloat16
    return torch.float32, torch.float16


def default_device() -> torch.device:
    return torch.device("cpu")


QUANTIZATION_MODES = ("auto", "gguf", "none", "fp8")


def load_model(
    ref: str,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    weight_dtype: torch.dtype | None = None,
    quantization: str | None = None,
    progress: LoadProgress | None = None,
    projector: str | None = None,
) -> LoadedModel:
    """dtype alone sets both activations and weights; neither picks the device's default.
    projector: llama.cpp's mmproj GGUF (vision tower and projector) beside a GGUF model.
    quantization: "auto" (default) keeps a GGUF file's quantized weights as they are ("gguf"),
    "none" dequantizes them, "fp8" stores the linear weights as FP8 E4M3 (Hopper GPUs).
    progress(done, total) is called as the checkpoint's tensors are placed."""
    quantization = quantization or "auto"
    if quantization not in QUANTIZATION_MODES:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATION_MODES)}, got {quantization!r}")
    source = resolve_model(ref)
    _refuse_encoder(source)
    device = torch.device(device) if device is not None else default_device()
    if dtype is None:
        dtype, default_weights = default_dtypes(device)
        weight_dtype = weight_dtype or default_weights
    weight_dtype = weight_dtype or dtype
    if quantization == "gguf" and source.format != "gguf":
        raise ValueError(f"{ref} is not a GGUF file; --quantization gguf needs one")
    keep_quantized = source.format == "gguf" and quantization in ("auto", "gguf")
    if source.format == "gguf":
        from mlxr.loader.gguf_model import read_gguf

        args, weights, tokenizer = read_gguf(source.path, keep_quantized, kept_types(device, quantization))
        args, weights = _with_projector(args, weights, tokenizer, projector)
    else:
        from mlxr.loader.hf_model import read_hf_dir

        _no_projector(ref, projector)
        args, weights, tokenizer = read_hf_dir(source.path)
    args = _with_canonical_type(args)
    model = materialize(args, weights, dtype, device, progress)
    mode = "gguf" if any(isinstance(m, QuantLinear) for m in model.modules()) else "none"
    fuse_projections(model)
    if quantization == "fp8":
        from mlxr.layers.fp8_linear import store_weights_fp8

        store_weights_fp8(model)
        mode = "fp8"
    if weight_dtype != dtype:
        store_weights_as(model, weight_dtype)
    log.info("loaded %s (%s, %s) on %s: activations %s, weights %s, quantization %s",
             ref, source.format, args.model_type, device, dtype, weight_dtype, mode)
    return LoadedModel(source, args, model, tokenizer, dtype, device, weight_dtype, mode)


def _with_projector(args: ModelArgs, weights, tokenizer: Tokenizer, projector: str | None, load: bool = True):
    if projector is None:
        return args, weights
    import itertools

    from mlxr.loader.mmproj_model import with_projector

    args, tower = with_projector(args, tokenizer, Path(projector), weights=load)
    return args, itertools.chain(weights, tower) if load else weights


def _no_projector(ref: str, projector: str | None) -> None:
    if projector is not None:
        raise ModelFormatError(f"{ref} is a Hugging Face directory: its vision tower is in it; an mmproj file goes "
                               "with a GGUF model")


def _refuse_encoder(source: ModelSource) -> None:
    """An encoder has no decoder engine: it is served by `mlxr serve` in the server's own
    process (loader/encoder_model.py), not through the generation API."""
    from mlxr.loader.encoder_model import source_is_encoder

    if source_is_encoder(source):
        raise UnsupportedModelError(f"{source.name} is an embedding or reranking model (an encoder): serve it with "
                                    "`mlxr serve` (one API process) and use /v1/embeddings, /api/embed or /v1/rerank")


def _with_canonical_type(args: ModelArgs) -> ModelArgs:
    from dataclasses import replace

    return replace(args, model_type=canonical_model_type(args.model_type))


def materialize(args: ModelArgs, weights, dtype: torch.dtype, device: torch.device,
                progress: LoadProgress | None = None) -> nn.Module:
    """Build the model without allocating random weights, then assign the checkpoint's."""
    with torch.device("meta"):
        model = build_model(args)
    expected = dict(model.named_parameters())
    state: dict[str, torch.Tensor] = {}
    packed: dict[str, PackedWeight] = {}
    total = sum(1 for n in expected if not _is_tied(args, n))
    for done, (name, tensor) in enumerate(weights, 1):
        if progress is not None:
            progress(done, total)
        if name not in expected:
            if args.tie_word_embeddings and name == "lm_head.weight":
                continue
            raise ModelFormatError(f"unexpected tensor {name!r} in the checkpoint")
        want = tuple(expected[name].shape)
        if tuple(tensor.shape) != want:
            raise ModelFormatError(f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {want}")
        if isinstance(tensor, PackedWeight):
            packed[name] = tensor.to(device)
        else:
            state[name] = tensor.to(device=device, dtype=dtype)
    missing = [n for n in expected if n not in state and n not in packed and not _is_tied(args, n)]
    if missing:
        raise ModelFormatError(f"the checkpoint lacks tensors: {', '.join(missing[:5])}")
    model.load_state_dict(state, strict=False, assign=True)
    if args.tie_word_embeddings and "model.embed_tokens.weight" in state:
        model.lm_head.weight = model.model.embed_tokens.weight
    install_packed(model, packed, dtype, args.tie_word_embeddings)
    for module in model.modules():
        if hasattr(module, "reset_buffers"):
            module.reset_buffers(device)
    return model.eval()


def _is_tied(args: ModelArgs, name: str) -> bool:
    return args.tie_word_embeddings and name == "lm_head.weight"


def load_frontend(ref: str, projector: str | None = None) -> tuple[ModelSource, ModelArgs, Tokenizer]:
    """A model's shape and tokenizer without building its weights (a frontend whose engine
    core loads the weights in its own process)."""
    source = resolve_model(ref)
    _refuse_encoder(source)
    if source.format == "gguf":
        from mlxr.loader.gguf_model import read_gguf

        args, _, tokenizer = read_gguf(source.path, True)
        args, _ = _with_projector(args, iter(()), tokenizer, projector, load=False)
    else:
        from mlxr.loader.hf_model import read_hf_dir

        _no_projector(ref, projector)
        args, _, tokenizer = read_hf_dir(source.path)
    return source, _with_canonical_type(args), tokenizer


def kept_types(device: torch.device, quantization: str) -> Collection[str]:
    """The GGUF types a load keeps quantized. On CPU under "auto", only those whose C kernels
    use integer dot products (quant.c, Q4_1 among them): the other extra types' plain C kernels
    decoded a Q4_1 file at 13 tok/s against 56 with its weights expanded to 16 bits at load
    (2-core AMD EPYC, bench/peers/cpu_vs_llama_cpp.py, 2026-11-24, before quant.c took Q4_1).
    `--quantization gguf` keeps every type. MXFP4 (gpt-oss's experts) always stays 4-bit: expanded,
    gpt-oss-20b's experts alone would take 40 GB."""
    from mlxr.ops.quant.block_types import CPU_INT_TYPES, KEPT_TYPES, MXFP4_TYPES

    return KEPT_TYPES if device.type != "cpu" or quantization == "gguf" else {**CPU_INT_TYPES, **MXFP4_TYPES}
