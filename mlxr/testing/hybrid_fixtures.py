"""Tiny random hybrid (recurrent-state + attention) models, written by transformers' own classes
as arch_fixtures.py writes the others (kept apart so that each family's table stays its own)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import safetensors.numpy

from mlxr.testing.arch_fixtures import _BASE, ArchFixture
from mlxr.testing.write_once import write_once

_QWEN35 = {**_BASE, "num_hidden_layers": 4, "layer_types": ["linear_attention", "linear_attention",
                                                            "linear_attention", "full_attention"],
           "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
           "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
           "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                               "mrope_section": [1, 1, 0]}}

# Three Gated DeltaNet layers then one gated full-attention layer; two value heads a key head
# (value heads as wide as key heads, as in the released models: llama.cpp requires it); RoPE on a
# quarter of each head, its multimodal sections shrunk to the two frequency pairs there are
# (text gives every section the same positions; llama.cpp checks they fit).
HYBRID_FIXTURES: dict[str, ArchFixture] = {
    "tiny-qwen35": ArchFixture({**_QWEN35, "model_type": "qwen3_5_text", "architectures": ["Qwen3_5ForCausalLM"]},
                               seed=30, gemma_norms=True),
    # Every layer's MLP a mixture: 8 experts, 2 a token (renormalised), and a shared expert
    # behind a sigmoid gate.
    "tiny-qwen35moe": ArchFixture({**_QWEN35, "model_type": "qwen3_5_moe_text",
                                   "architectures": ["Qwen3_5MoeForCausalLM"], "num_experts": 8,
                                   "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                   "shared_expert_intermediate_size": 48},
                                  seed=31, gemma_norms=True),
}


HYBRID_ARCHS = ("qwen35", "qwen35moe")  # the architectures these fixtures cover (tests/models/test_qwen35.py)
HYBRID_FIXTURE_VERSION = 3  # bump when the written files change


def hybrid_fixture_dir(name: str, root):
    from mlxr.testing.arch_fixtures import arch_fixture_dir

    return arch_fixture_dir(f"{name}-h{HYBRID_FIXTURE_VERSION}", root, HYBRID_FIXTURES[name])


def write_hybrid_mtp_target(target_dir, out_dir, seed: int = 0, weights: dict | None = None,
                            target_scale: float = 1.0):
    """A copy of a hybrid fixture whose checkpoint also holds one MTP layer, laid out as the
    released Qwen3.5 checkpoints lay it out (transformers drops `mtp.*` on save_pretrained):
    `mtp.fc` (2 x hidden -> hidden), `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`,
    `mtp.norm`, and `mtp.layers.0.*` named and shaped as the target's full-attention layer
    (a MoE target's experts one tensor each, as its own layers are); config.json gets
    `mtp_num_hidden_layers: 1`, which llama.cpp's converter reads. Random weights (norms near
    their neutral 0: Qwen3.5 scales by 1 + w) unless weights are given."""
    target_dir, out_dir = Path(target_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in target_dir.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy(f, out_dir / f.name)
    config = json.loads((target_dir / "config.json").read_text())
    config["mtp_num_hidden_layers"] = 1
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    tensors = safetensors.numpy.load_file(str(target_dir / "model.safetensors"))
    if target_scale != 1.0:
        tensors = scale_residual_writers(tensors, target_scale)
    tensors.update(weights if weights is not None else _random(hybrid_mtp_shapes(config, tensors), seed))
    safetensors.numpy.save_file(tensors, str(out_dir / "model.safetensors"))
    return out_dir


def hybrid_mtp_shapes(config: dict, tensors: dict) -> dict[str, tuple[int, ...]]:
    """The MTP layer's tensors and shapes: its block's copied from the last full-attention layer's."""
    full = max(i for i, kind in enumerate(config["layer_types"]) if kind == "full_attention")
    layer, h = f"model.layers.{full}.", config["hidden_size"]
    shapes = {"mtp.fc.weight": (h, 2 * h), "mtp.pre_fc_norm_embedding.weight": (h,),
              "mtp.pre_fc_norm_hidden.weight": (h,), "mtp.norm.weight": (h,)}
    shapes.update({"mtp.layers.0." + n[len(layer):]: tuple(t.shape) for n, t in tensors.items() if n.startswith(layer)})
    return shapes


def _random(shapes: dict[str, tuple[int, ...]], seed: int, std: float = 0.1) -> dict:

    rng = np.random.default_rng(seed)
    return {n: (std * rng.standard_normal(s)).astype(np.float32) for n, s in shapes.items()}


HYBRID_MTP_SEED = 40


ECHO_SCALE = 0.05  # the echo fixture's target: every layer's output into the residual stream, scaled
_RESIDUAL_WRITERS = ("o_proj.weight", "out_proj.weight", "down_proj.weight")


def echo_mtp_weights(shapes: dict[str, tuple[int, ...]], seed: int) -> dict:
    """An MTP layer that passes the next token's normed embedding through (fc takes the
    embedding half as is, the block's attention and MLP outputs are zero, norms neutral). Beside
    a target whose layers write little into the stream (scale_residual_writers) its logits are
    close to what the target computes at that token: its drafts are often kept, not always (the
    tests need both; random weights keep none)."""
    w = _random(shapes, seed)
    h = shapes["mtp.fc.weight"][0]
    w["mtp.fc.weight"] = np.concatenate([np.eye(h), np.zeros((h, h))], axis=1).astype(np.float32)
    for name, shape in shapes.items():
        if len(shape) == 1 and name.endswith("norm.weight"):
            w[name] = np.zeros(shape, np.float32)
        if name.endswith(_RESIDUAL_WRITERS):
            w[name] = np.zeros(shape, np.float32)
    return w


MIXER_WRITERS = ("o_proj.weight", "linear_attn.out_proj.weight")  # attention's and DeltaNet's outputs


def scale_residual_writers(tensors: dict, scale: float, writers: tuple[str, ...] = _RESIDUAL_WRITERS) -> dict:
    """The target's layers' outputs into the residual stream (writers: which) scaled: its next
    token then leans on the current one."""
    return {n: (t * scale).astype(t.dtype) if n.startswith("model.layers.") and n.endswith(writers)
            else t for n, t in tensors.items()}


def write_scaled_mixer_target(target_dir, out_dir, scale: float):
    """A copy of a hybrid fixture whose token mixers' outputs (attention and DeltaNet) are scaled:
    as head_fixtures.write_scaled_attention_target for llama, the target a trained MTP layer copies."""
    target_dir, out_dir = Path(target_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in target_dir.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy(f, out_dir / f.name)
    tensors = safetensors.numpy.load_file(str(target_dir / "model.safetensors"))
    scaled = scale_residual_writers(tensors, scale, MIXER_WRITERS)
    safetensors.numpy.save_file(scaled, str(out_dir / "model.safetensors"))
    return out_dir


def hybrid_mtp_fixture_dir(name: str, root, echo: bool = False):
    """The hybrid fixture `name` with a random MTP layer (write_hybrid_mtp_target), or with
    echo_mtp_weights', written once under root (its HF directory; llama.cpp's GGUF of it converts
    without --no-mtp)."""
    final = Path(root) / f"{name}-h{HYBRID_FIXTURE_VERSION}-mtp{'-echo' if echo else ''}-v2"
    if not final.is_dir():
        source = hybrid_fixture_dir(name, root)

        def write(tmp: Path) -> None:
            weights = None
            if echo:
                config = json.loads((source / "config.json").read_text())
                tensors = safetensors.numpy.load_file(str(source / "model.safetensors"))
                weights = echo_mtp_weights(hybrid_mtp_shapes(config, tensors), HYBRID_MTP_SEED)
            write_hybrid_mtp_target(source, tmp / "hf", HYBRID_MTP_SEED, weights, ECHO_SCALE if echo else 1.0)

        write_once(final, write, f"{name}-mtp")
    return final / "hf"
