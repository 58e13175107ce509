"""bitsandbytes 4-bit (NF4) checkpoints: a checkpoint written by hand in bitsandbytes' saved
layout (Linear4bit weights as uint8 pairs, absmax with and without double quantization,
quant_map, the packed JSON quant state) loads without bitsandbytes, stays 4-bit, and matches
a pure-torch NF4 dequantization over QLoRA's published table."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from model_fixtures import fixture_model
from paged_probe import paged_logits
from quant_blocks import NF4_TABLE
from safetensors.torch import load_file, save_file

from mlxr.errors import UnsupportedModelError
from mlxr.layers.quant_linear import QuantLinear
from mlxr.llm import LLM
from mlxr.ops.quant.quant import qmatmul
from mlxr.ops.quant.reference import dequantize
from mlxr.types import SamplingParams

TABLE = torch.from_numpy(NF4_TABLE)
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def nf4_quantize(w: torch.Tensor, nested: bool) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """bitsandbytes' saved tensors for w (suffixes after ".weight"), and w as they dequantize."""
    blocks = w.float().reshape(-1, 64)
    absmax = blocks.abs().amax(-1)
    q = (blocks / absmax[:, None]).unsqueeze(-1).sub(TABLE).abs().argmin(-1).to(torch.uint8)
    parts = {"": (q[:, 0::2] << 4 | q[:, 1::2]).reshape(-1, 1), "quant_map": TABLE.clone()}
    state = {"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": list(w.shape)}
    if nested:
        offset = absmax.mean()
        code = torch.linspace(-1, 1, 256)
        centred = (absmax - offset).reshape(-1)
        pad = (-centred.numel()) % 256
        scale = torch.nn.functional.pad(centred, (0, pad)).reshape(-1, 256).abs().amax(-1)
        per = scale.repeat_interleave(256)[: centred.numel()]
        qa = (centred / per).unsqueeze(-1).sub(code).abs().argmin(-1).to(torch.uint8)
        absmax = code[qa.long()] * per + offset
        parts |= {"absmax": qa, "nested_absmax": scale, "nested_quant_map": code}
        state |= {"nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": float(offset)}
    else:
        parts["absmax"] = absmax
    parts["quant_state.bitsandbytes__nf4"] = torch.tensor(list(json.dumps(state).encode()), dtype=torch.uint8)
    reference = (TABLE[q.long()] * absmax[:, None]).reshape(w.shape)
    return parts, reference


def write_nf4_checkpoint(src: Path, out: Path, ref_out: Path) -> None:
    """out: the bnb checkpoint; ref_out: the same model with the NF4 weights dequantized."""
    weights = load_file(str(src / "model.safetensors"))
    packed, reference = {}, {}
    for name, w in weights.items():
        if name.split(".")[-2] in LINEARS:
            parts, deq = nf4_quantize(w, nested=".layers.0." in name)
            packed |= {name + ("." + k if k else ""): v for k, v in parts.items()}
            reference[name] = deq
        else:
            packed[name] = reference[name] = w
    for folder, tensors in ((out, packed), (ref_out, reference)):
        shutil.copytree(src, folder)
        save_file(tensors, str(folder / "model.safetensors"))
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True,
                                     "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True}
    (out / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("nf4")
    write_nf4_checkpoint(fixture_model("tiny-llama").hf_dir, root / "nf4", root / "ref")
    return root / "nf4", root / "ref"


def test_nf4_checkpoint_loads_kept_4bit_and_matches_the_reference(checkpoints) -> None:
    nf4_dir, ref_dir = checkpoints
    ours = LLM(str(nf4_dir), dtype=torch.float32, max_num_seqs=1)
    ref = LLM(str(ref_dir), dtype=torch.float32, max_num_seqs=1)
    linears = [m for m in ours.loaded.model.modules() if isinstance(m, QuantLinear)]
    assert len(linears) == 2 * 4 and {m.qtype for m in linears} == {"NF4"}  # qkv and gate_up fused; o, down
    want = load_file(str(ref_dir / "model.safetensors"))["model.layers.0.mlp.down_proj.weight"]
    down = ours.loaded.model.model.layers[0].mlp.down_proj
    assert torch.equal(dequantize(down.raw, "NF4", down.in_features), want)
    x = torch.randn(3, down.in_features)
    assert torch.allclose(qmatmul(x, down.raw, "NF4", down.in_features), x @ want.T, rtol=1e-5, atol=1e-5)
    ids = ours.tokenizer.encode("Hello there, general Kenobi. You are a bold one")
    a, b = paged_logits(ours, ids, 4), paged_logits(ref, ids, len(ids))
    assert (a - b).norm() / b.norm() < 1e-5
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    assert ours.generate([ids], params)[0].outputs[0].token_ids == ref.generate([ids], params)[0].outputs[0].token_ids


def test_registry_imports_the_nf4_checkpoint(checkpoints, tmp_path: Path) -> None:
    from mlxr.loader.preflight import check_loadable
    from mlxr.registry import Registry

    record = Registry(tmp_path / "home").import_model(checkpoints[0], "tiny:nf4", check=check_loadable)
    assert record.quantization == "NF4" and record.format == "safetensors"


def test_fp4_is_refused(checkpoints, tmp_path: Path) -> None:
    nf4_dir, _ = checkpoints
    bad = tmp_path / "fp4"
    shutil.copytree(nf4_dir, bad)
    tensors = load_file(str(bad / "model.safetensors"))
    key = next(k for k in tensors if k.endswith("bitsandbytes__nf4"))
    tensors[key.replace("__nf4", "__fp4")] = tensors.pop(key)
    save_file(tensors, str(bad / "model.safetensors"))
    with pytest.raises(UnsupportedModelError, match="FP4"):
        LLM(str(bad), dtype=torch.float32, max_num_seqs=1)
