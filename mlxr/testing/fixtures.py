"""Random-weight fixture models written twice from the same weights: as a Hugging Face
directory (config.json, safetensors, tokenizer files) and as a GGUF file in llama.cpp's
conventions (gguf-py tensor names, Q/K row permutation for llama, 1 + w gemma norms).

The GGUF side is written with mlxr.quantize.hf_convert (the converter `mlxr quantize` uses),
which takes gguf-py's own name map, not mlxr's loader, so tests that map the GGUF back to HF
names check the loader against an independent writer.
"""
from __future__ import annotations

import json
import math
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
import safetensors

from mlxr.quantize.hf_convert import HFToGGUF
from mlxr.testing import fixture_tokenizer as ft
from mlxr.testing.write_once import write_once

FIXTURE_VERSION = 2  # bump when the written files change, so cached fixtures are rewritten
GGUF_TYPES = {
    "f32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32),
    "f16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
    "q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "q4_k": (gguf.GGMLQuantizationType.Q4_K, gguf.LlamaFileType.MOSTLY_Q4_K_M),
}


@dataclass(frozen=True)
class FixtureSpec:
    family: str  # "llama" | "qwen2" | "gemma3"
    config: dict
    tokenizer: ft.TokenizerSpec
    weight_std: float = 0.1
    seed: int = 0
    safetensors_dtype: str = "F32"  # "F32" | "BF16"
    gguf_type: str = "f32"
    shard_bytes: int = 0  # 0: one model.safetensors


@dataclass(frozen=True)
class FixturePaths:
    hf_dir: Path
    gguf_path: Path


def _llama_config(**over: object) -> dict:
    base = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512,
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None,
        "max_position_embeddings": 256, "tie_word_embeddings": False, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2,
        "torch_dtype": "float32",
    }
    return {**base, **over}


_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
_QWEN2 = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 512,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "rope_scaling": None, "max_position_embeddings": 256,
    "tie_word_embeddings": True, "hidden_act": "silu", "use_sliding_window": False,
    "sliding_window": None, "max_window_layers": 2, "bos_token_id": 0, "eos_token_id": 2,
    "torch_dtype": "float32",
}
_GEMMA3 = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 512,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32,
    "query_pre_attn_scalar": 32, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0, "rope_scaling": None, "sliding_window": 8,
    "sliding_window_pattern": 6, "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
    "max_position_embeddings": 512, "hidden_activation": "gelu_pytorch_tanh",
    "final_logit_softcapping": None, "attn_logit_softcapping": None, "attention_bias": False,
    "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": [1, 5], "pad_token_id": 0,
    "torch_dtype": "float32",
}
CONFIGS: dict[str, FixtureSpec] = {
    "tiny-llama": FixtureSpec("llama", _llama_config(), ft.LLAMA),
    "tiny-llama-tied": FixtureSpec("llama", _llama_config(tie_word_embeddings=True), ft.LLAMA, seed=1),
    # A long context, so a server test's stream can outlast the test's own round trips however
    # fast the host decodes (256 tokens of tiny-llama pass in well under a second).
    "tiny-llama-long": FixtureSpec("llama", _llama_config(max_position_embeddings=4096), ft.LLAMA, seed=18),
    "tiny-llama3": FixtureSpec("llama", _llama_config(
        rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE, max_position_embeddings=512), ft.LLAMA, seed=2),
    "tiny-qwen2": FixtureSpec("qwen2", _QWEN2, ft.QWEN2, seed=3),
    "tiny-gemma3": FixtureSpec("gemma3", _GEMMA3, ft.GEMMA, seed=4),
    # Mistral: the llama anatomy with a window of 8 on every layer, inside a 24-token prompt.
    "tiny-mistral": FixtureSpec("llama", _llama_config(
        model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=8), ft.LLAMA, seed=6),
    "tinyllama-shape": FixtureSpec("llama", _llama_config(
        vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
        num_attention_heads=32, num_key_value_heads=4, head_dim=64, max_position_embeddings=2048,
        torch_dtype="bfloat16"), ft.LLAMA, weight_std=0.02, safetensors_dtype="BF16",
        gguf_type="f16", shard_bytes=1 << 30),
    # Tensor parallelism over 4 ranks with Q4_K weights: every split along a matrix's inputs
    # (o_proj: heads x head_dim, down_proj: intermediate) is a multiple of 256 per rank.
    "tp-llama": FixtureSpec("llama", _llama_config(
        hidden_size=256, intermediate_size=1024, num_attention_heads=8, num_key_value_heads=2,
        head_dim=128), ft.LLAMA, seed=7),
    "tp-qwen2": FixtureSpec("qwen2", {**_QWEN2, "hidden_size": 1024, "intermediate_size": 1024,
                                      "num_attention_heads": 8, "num_key_value_heads": 2}, ft.QWEN2, seed=8),
    "tp-gemma3": FixtureSpec("gemma3", {
        **_GEMMA3, "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 2,
        "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 128, "query_pre_attn_scalar": 128,
        "sliding_window_pattern": 2, "layer_types": ["sliding_attention", "full_attention"]}, ft.GEMMA, seed=9),
    # The TinyLlama shape's vocabulary and tokenizer with almost no model: host-cost benchmarks.
    "tinyllama-vocab": FixtureSpec("llama", _llama_config(
        vocab_size=32000, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=512), ft.LLAMA, seed=5),
}


@dataclass(frozen=True)
class Param:
    name: str  # HF name
    shape: tuple[int, ...]
    kind: str  # "matrix" | "norm" | "bias"


def hf_params(spec: FixtureSpec) -> list[Param]:
    """Every parameter of the HF model, in checkpoint order."""
    c = spec.config
    h, inter, heads = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    hd = c.get("head_dim") or h // heads
    q, kv = heads * hd, c["num_key_value_heads"] * hd
    out = [Param("model.embed_tokens.weight", (c["vocab_size"], h), "matrix")]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [Param(p + "self_attn.q_proj.weight", (q, h), "matrix"),
                Param(p + "self_attn.k_proj.weight", (kv, h), "matrix"),
                Param(p + "self_attn.v_proj.weight", (kv, h), "matrix"),
                Param(p + "self_attn.o_proj.weight", (h, q), "matrix")]
        if spec.family == "qwen2":
            out += [Param(p + f"self_attn.{x}_proj.bias", (n,), "bias") for x, n in (("q", q), ("k", kv), ("v", kv))]
        if spec.family == "gemma3":
            out += [Param(p + "self_attn.q_norm.weight", (hd,), "norm"), Param(p + "self_attn.k_norm.weight", (hd,), "norm")]
        out += [Param(p + "mlp.gate_proj.weight", (inter, h), "matrix"),
                Param(p + "mlp.up_proj.weight", (inter, h), "matrix"),
                Param(p + "mlp.down_proj.weight", (h, inter), "matrix"),
                Param(p + "input_layernorm.weight", (h,), "norm"),
                Param(p + "post_attention_layernorm.weight", (h,), "norm")]
        if spec.family == "gemma3":
            out += [Param(p + "pre_feedforward_layernorm.weight", (h,), "norm"),
                    Param(p + "post_feedforward_layernorm.weight", (h,), "norm")]
    out.append(Param("model.norm.weight", (h,), "norm"))
    if not c.get("tie_word_embeddings", spec.family == "gemma3"):
        out.append(Param("lm_head.weight", (c["vocab_size"], h), "matrix"))
    return out


def make_weight(spec: FixtureSpec, param: Param) -> np.ndarray:
    """The float32 value of one parameter as the HF checkpoint stores it (seeded per name)."""
    rng = np.random.default_rng([spec.seed, zlib.crc32(param.name.encode())])
    x = rng.standard_normal(param.shape, dtype=np.float32)
    if param.kind == "matrix":
        x *= np.float32(spec.weight_std)
    elif param.kind == "bias":
        x *= np.float32(0.1)
    elif spec.family == "gemma3":
        # gemma computes x * (1 + w): w near 0, on a 2**-12 grid so that GGUF's 1 + w is exact
        x = np.round(x * np.float32(0.1 * 4096)) / np.float32(4096)
    else:
        x = np.float32(1.0) + np.float32(0.1) * x
    if spec.safetensors_dtype == "BF16":
        x = bf16_bits_to_f32(f32_to_bf16_bits(x))
    return x


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    bits = x.astype(np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))  # round to nearest even
    return (rounded >> np.uint32(16)).astype(np.uint16)


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


# ---- GGUF side: llama.cpp conventions (mlxr.quantize.hf_convert) --------------------


def _gguf_encode(value: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    if value.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
        return value.astype(np.float32)  # llama.cpp keeps 1-D tensors in F32
    from mlxr.quantize.encode import encode  # Q4_K: gguf-py only dequantizes K-quants

    return encode(value, qtype)


def _gguf_metadata(w: gguf.GGUFWriter, spec: FixtureSpec, conv: HFToGGUF, tok, ftype: gguf.LlamaFileType) -> None:
    w.add_name(f"mlxr fixture {spec.family}")
    w.add_file_type(ftype)
    if ftype != gguf.LlamaFileType.ALL_F32:
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    conv.write_hparams(w)
    _gguf_tokenizer(w, spec, tok)


def _gguf_tokenizer(w: gguf.GGUFWriter, spec: FixtureSpec, tok) -> None:
    tokens, types, merges = ft.gguf_vocab(tok, spec.tokenizer)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    t = spec.tokenizer
    bos = ft.token_id(tok, t.bos) if t.bos is not None else spec.config.get("bos_token_id")
    if bos is not None:  # like gguf-py's SpecialVocab, fall back to config.json's id
        w.add_bos_token_id(bos)
    w.add_eos_token_id(ft.token_id(tok, t.eos[0]))
    if t.pad is not None:
        w.add_pad_token_id(ft.token_id(tok, t.pad))
    w.add_add_bos_token(t.add_bos)
    w.add_add_eos_token(False)
    w.add_chat_template(ft.CHAT_TEMPLATES[t.chat])


# ---- writing both --------------------------------------------------------------------


@dataclass
class _Shards:
    """Collects HF tensors and writes a safetensors file whenever a shard is full."""

    out_dir: Path
    spec: FixtureSpec
    pending: dict = field(default_factory=dict)
    pending_bytes: int = 0
    total_bytes: int = 0
    files: list[tuple[str, list[str]]] = field(default_factory=list)

    def add(self, name: str, value: np.ndarray) -> None:
        bf16 = self.spec.safetensors_dtype == "BF16"
        data = np.ascontiguousarray(f32_to_bf16_bits(value) if bf16 else value, dtype=np.uint16 if bf16 else np.float32)
        if self.spec.shard_bytes and self.pending and self.pending_bytes + data.nbytes > self.spec.shard_bytes:
            self.flush()
        self.pending[name] = data
        self.pending_bytes += data.nbytes
        self.total_bytes += data.nbytes

    def flush(self) -> None:
        if not self.pending:
            return
        dtype = "bfloat16" if self.spec.safetensors_dtype == "BF16" else "float32"
        specs = {k: safetensors.TensorSpec(dtype=dtype, shape=list(a.shape), data_ptr=a.ctypes.data, data_len=a.nbytes)
                 for k, a in self.pending.items()}
        name = f"shard-{len(self.files):05d}.safetensors"
        # self.pending keeps the arrays behind data_ptr alive during the call
        safetensors.serialize_file(specs, str(self.out_dir / name), metadata={"format": "pt"})
        self.files.append((name, list(self.pending)))
        self.pending, self.pending_bytes = {}, 0

    def finish(self) -> None:
        self.flush()
        if not self.spec.shard_bytes:
            (self.out_dir / self.files[0][0]).rename(self.out_dir / "model.safetensors")
            return
        n = len(self.files)
        weight_map = {}
        for i, (old, names) in enumerate(self.files):
            new = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            (self.out_dir / old).rename(self.out_dir / new)
            weight_map.update({t: new for t in names})
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
        (self.out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def write_fixture(name: str, out_dir: Path, gguf_type: str | None = None) -> FixturePaths:
    """Write `name`'s HF directory (out_dir/hf) and GGUF (out_dir/model-<type>.gguf)."""
    spec = CONFIGS[name]
    gguf_type = gguf_type or spec.gguf_type
    qtype, ftype = GGUF_TYPES[gguf_type]
    hf_dir = Path(out_dir) / "hf"
    hf_dir.mkdir(parents=True, exist_ok=True)
    gguf_path = Path(out_dir) / f"model-{gguf_type}.gguf"
    tok = ft.build_tokenizer(spec.tokenizer, spec.config["vocab_size"])
    _write_hf_metadata(spec, tok, hf_dir)
    params = hf_params(spec)
    conv = HFToGGUF(spec.config)
    writer = gguf.GGUFWriter(str(gguf_path), conv.arch_name)
    extras = conv.extra_tensors()
    for p in params:
        _add_info(writer, conv.gguf_name(p.name), p.shape, qtype)
    for gname, value in extras:
        _add_info(writer, gname, value.shape, qtype)
    _gguf_metadata(writer, spec, conv, tok, ftype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    shards = _Shards(hf_dir, spec)
    for p, value in _values(spec, params, gguf_type):
        shards.add(p.name, value)
        writer.write_tensor_data(_gguf_encode(conv.convert(p.name, value), qtype))
    for _, value in extras:
        writer.write_tensor_data(_gguf_encode(value, qtype))
    writer.close()
    shards.finish()
    return FixturePaths(hf_dir, gguf_path)


def _values(spec: FixtureSpec, params: list[Param], gguf_type: str) -> Iterator[tuple[Param, np.ndarray]]:
    for p in params:
        value = make_weight(spec, p)
        if gguf_type == "f16" and value.ndim > 1:
            # Both files then hold the very same numbers, so their logits must be identical.
            value = value.astype(np.float16).astype(np.float32)
        yield p, value


def _add_info(writer: gguf.GGUFWriter, gname: str, shape: tuple[int, ...], qtype: gguf.GGMLQuantizationType) -> None:
    t = gguf.GGMLQuantizationType.F32 if len(shape) == 1 else qtype
    block, size = gguf.GGML_QUANT_SIZES[t]
    nbytes = math.prod(shape) // block * size
    writer.add_tensor_info(gname, shape, np.dtype(np.float32), nbytes, raw_dtype=t)


def _write_hf_metadata(spec: FixtureSpec, tok, hf_dir: Path) -> None:
    c = spec.config
    (hf_dir / "config.json").write_text(json.dumps(c, indent=2))
    t = spec.tokenizer
    eos = [ft.token_id(tok, e) for e in t.eos]
    gen = {"bos_token_id": ft.token_id(tok, t.bos), "eos_token_id": eos if len(eos) > 1 else eos[0],
           "pad_token_id": ft.token_id(tok, t.pad)}
    (hf_dir / "generation_config.json").write_text(json.dumps({k: v for k, v in gen.items() if v is not None}, indent=2))
    for fname, text in ft.hf_tokenizer_files(tok, t, c["max_position_embeddings"]).items():
        (hf_dir / fname).write_text(text, encoding="utf-8")


def fixture_paths(name: str, root: Path = Path(".fixtures"), gguf_type: str | None = None) -> FixturePaths:
    """Write the fixture once under root and reuse it afterwards (safe across processes:
    each writer fills a private directory and renames it into place)."""
    gguf_type = gguf_type or CONFIGS[name].gguf_type
    final = Path(root) / f"{name}-{gguf_type}-v{FIXTURE_VERSION}"
    write_once(final, lambda tmp: write_fixture(name, tmp, gguf_type), name)
    return FixturePaths(final / "hf", final / f"model-{gguf_type}.gguf")
