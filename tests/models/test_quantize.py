"""`mlxr quantize`: K-quant blocks checked against gguf-py's dequantizers, llama.cpp's type
mix and metadata, reload through MLXR's loader, atomic output and the CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import safetensors.numpy
from model_fixtures import cached_llm, fixture_model
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from mlxr import SamplingParams
from mlxr.errors import UnsupportedModelError
from mlxr.formats.gguf import open_gguf
from mlxr.quantize import FILE_TYPES, quantize_model
from mlxr.quantize import quantizer as quantizer_module
from mlxr.quantize.encode import encode
from mlxr.quantize.hf_convert import HFToGGUF
from mlxr.quantize.hf_tokenizer import add_hf_tokenizer
from mlxr.quantize.kquants import quantize_q4_k, quantize_q6_k
from mlxr.quantize.mix import TypePlanner, use_more_bits
from mlxr.testing import fixture_tokenizer as ft
from mlxr.testing.fixtures import FixtureSpec, hf_params, make_weight

MLXR = Path(sys.executable).parent / "mlxr"
PROMPTS = ["The quick brown fox", "Once upon a time", "Hello! How are you"]


def rel_rms(approx: np.ndarray, exact: np.ndarray) -> float:
    return float(np.sqrt(np.mean((approx - exact) ** 2) / np.mean(exact ** 2)))


def gaussian(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


# ---- blocks ------------------------------------------------------------------------------


@pytest.mark.parametrize("fn, qtype, limit, block_bytes", [
    (quantize_q4_k, Q.Q4_K, 0.10, 144), (quantize_q6_k, Q.Q6_K, 0.03, 210),
])
def test_k_quants_round_trip_through_gguf_py(fn, qtype: Q, limit: float, block_bytes: int) -> None:
    x = gaussian((96, 768)) * np.float32(0.02)
    blocks = fn(x)
    assert blocks.dtype == np.uint8 and blocks.shape == (96, 3 * block_bytes)
    err = rel_rms(dequantize(blocks, qtype), x)
    naive = rel_rms(dequantize(fn(x, search=False), qtype), x)
    assert err < limit and err < 0.97 * naive, (err, naive)


def test_q8_0_error_is_under_one_percent() -> None:
    x = gaussian((64, 512))
    assert rel_rms(dequantize(encode(x, Q.Q8_0), Q.Q8_0), x) < 0.01


@pytest.mark.parametrize("fn, qtype, spiky_limit", [(quantize_q4_k, Q.Q4_K, 0.15), (quantize_q6_k, Q.Q6_K, 0.05)])
def test_k_quants_edge_cases(fn, qtype: Q, spiky_limit: float) -> None:
    zeros = np.zeros((2, 256), np.float32)
    assert not dequantize(fn(zeros), qtype).any()
    const = np.full((1, 256), 3.0, np.float32)
    assert np.allclose(dequantize(fn(const), qtype), 3.0, rtol=1e-3)
    shifted = gaussian((4, 512), seed=1) + np.float32(5.0)  # all positive: min is clamped to 0
    assert rel_rms(dequantize(fn(shifted), qtype), shifted) < 0.05
    spiky = gaussian((1, 256), seed=2)
    spiky[0, 7] = 100.0  # the other sub-blocks keep their own scales (coarser: 6 or 8 bits of the top one)
    assert rel_rms(dequantize(fn(spiky), qtype)[0, 32:], spiky[0, 32:]) < spiky_limit
    with pytest.raises(ValueError):
        fn(np.zeros((2, 64), np.float32))


# ---- type mix ----------------------------------------------------------------------------


def test_use_more_bits_follows_llama_cpp() -> None:
    assert [i for i in range(8) if use_more_bits(i, 8)] == [0, 3, 6, 7]
    assert [i for i in range(16) if use_more_bits(i, 16)] == [0, 1, 4, 7, 10, 13, 14, 15]
    assert sum(use_more_bits(i, 32) for i in range(32)) == 16  # about half


def _planner(file_type: str, n_layers: int, output: bool) -> TypePlanner:
    names = ["token_embd.weight", "output_norm.weight"] + (["output.weight"] if output else [])
    for i in range(n_layers):
        names += [f"blk.{i}.{t}.weight" for t in ("attn_q", "attn_v", "ffn_down", "attn_norm")]
    return TypePlanner(FILE_TYPES[file_type], names)


def test_type_rules_for_output_embeddings_and_fallbacks() -> None:
    p = _planner("q4_k_m", 8, output=True)
    assert p.choose("output.weight", (512, 256)).qtype == Q.Q6_K
    assert p.choose("token_embd.weight", (512, 256)).qtype == Q.Q4_K
    assert p.choose("blk.0.attn_norm.weight", (256,)).qtype == Q.F32
    tied = _planner("q4_k_m", 8, output=False)
    assert tied.choose("token_embd.weight", (512, 256)).qtype == Q.Q6_K  # it is also the output
    # rows of 64: llama.cpp's substitutes for K-quants
    assert p.choose("blk.1.attn_q.weight", (64, 64)) .qtype == Q.Q5_0
    assert p.choose("blk.0.attn_v.weight", (64, 64)).qtype == Q.Q8_0
    assert p.choose("blk.1.attn_q.weight", (64, 48)).qtype == Q.F16
    q4_0 = _planner("q4_0", 8, output=True)
    assert q4_0.choose("output.weight", (512, 256)).qtype == Q.Q6_K
    assert q4_0.choose("blk.0.attn_v.weight", (64, 256)).qtype == Q.Q4_0
    q8 = _planner("q8_0", 8, output=True)
    assert {q8.choose(n, (512, 256)).qtype for n in ("output.weight", "blk.0.ffn_down.weight")} == {Q.Q8_0}


def _synthetic_hf(root: Path, n_layers: int = 8) -> tuple[Path, dict[str, np.ndarray]]:
    """A llama whose every row is a multiple of 256, with the tiny-llama tokenizer."""
    tiny = fixture_model("tiny-llama").hf_dir
    config = {**json.loads((tiny / "config.json").read_text()), "hidden_size": 256,
              "intermediate_size": 512, "num_hidden_layers": n_layers, "num_attention_heads": 4,
              "num_key_value_heads": 1, "head_dim": 64}
    spec = FixtureSpec("llama", config, ft.LLAMA, weight_std=0.05)
    weights = {p.name: make_weight(spec, p) for p in hf_params(spec)}
    root.mkdir()
    safetensors.numpy.save_file(weights, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (root / name).write_text((tiny / name).read_text())
    return root, weights


def test_q4_k_m_mix_and_errors_on_a_256_row_model(tmp_path: Path) -> None:
    hf_dir, weights = _synthetic_hf(tmp_path / "hf")
    out = quantize_model(hf_dir, tmp_path / "m.gguf", "q4_k_m").path
    conv = HFToGGUF(json.loads((hf_dir / "config.json").read_text()))
    with open_gguf(out) as f:
        assert f.metadata["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q4_K_M
        types = {n: f.tensor_info(n).ggml_type for n in f.tensor_names}
        for hf_name, value in weights.items():
            name = conv.gguf_name(hf_name)
            limit = {"Q4_K": 0.10, "Q6_K": 0.03, "F32": 0.0}[types[name]]
            assert rel_rms(f.load(name), conv.convert(hf_name, value)) <= limit, name
    more_bits = {f"blk.{i}.{t}.weight" for i in (0, 3, 6, 7) for t in ("attn_v", "ffn_down")}
    for name, t in types.items():
        if name.endswith("norm.weight"):
            assert t == "F32"
        elif name in more_bits or name == "output.weight":
            assert t == "Q6_K", name
        else:
            assert t == "Q4_K", name


# ---- tiny models -------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen2", "tiny-gemma3"])
def test_q8_0_reloads_close_to_the_f32_model(tmp_path: Path, model: str) -> None:
    paths = fixture_model(model)
    out = quantize_model(paths.hf_dir, tmp_path / "q8.gguf", "q8_0").path
    with open_gguf(out) as q, open_gguf(paths.gguf_path) as ref:
        assert q.architecture == ref.architecture
        assert q.metadata["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q8_0
        assert q.metadata["general.quantization_version"] == 2
        assert sorted(q.tensor_names) == sorted(ref.tensor_names)
        for name in q.tensor_names:
            info = q.tensor_info(name)
            assert info.ggml_type == ("F32" if len(info.shape) == 1 else "Q8_0"), name
            assert rel_rms(q.load(name), ref.load(name)) < 0.01, name
        for key, value in ref.metadata.items():
            if key.startswith(f"{ref.architecture}."):
                assert q.metadata[key] == value, key
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    want = cached_llm(str(paths.gguf_path)).generate(PROMPTS, params)
    got = cached_llm(str(out)).generate(PROMPTS, params)
    same = sum(a == b for w, g in zip(want, got) for a, b in zip(w.outputs[0].token_ids, g.outputs[0].token_ids))
    assert same >= 0.75 * 12 * len(PROMPTS)


def test_gguf_source_keeps_metadata_and_rope_freqs(tmp_path: Path) -> None:
    src = fixture_model("tiny-llama3").gguf_path
    out = quantize_model(src, tmp_path / "q.gguf", "q4_k_m").path
    with open_gguf(out) as q, open_gguf(src) as ref:
        for key, value in ref.metadata.items():
            if key not in ("general.file_type", "general.quantization_version"):
                assert q.metadata[key] == value and q.value_types[key] == ref.value_types[key], key
        assert q.tensor_names == ref.tensor_names
        assert q.tensor_info("rope_freqs.weight").ggml_type == "F32"
        assert np.array_equal(q.load("rope_freqs.weight"), ref.load("rope_freqs.weight"))
        assert q.tensor_info("token_embd.weight").ggml_type == "Q5_0"  # 64-wide rows: no Q4_K


def test_hf_source_writes_llama3_rope_freqs_like_the_converter(tmp_path: Path) -> None:
    paths = fixture_model("tiny-llama3")
    out = quantize_model(paths.hf_dir, tmp_path / "q.gguf", "q8_0").path
    with open_gguf(out) as q, open_gguf(paths.gguf_path) as ref:
        assert np.array_equal(q.load("rope_freqs.weight"), ref.load("rope_freqs.weight"))


def test_quantized_source_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "again.gguf"
    with pytest.raises(UnsupportedModelError, match="already quantized"):
        quantize_model(fixture_model("tiny-llama", "q8_0").gguf_path, out, "q4_k_m")
    assert list(tmp_path.iterdir()) == []


def test_failure_leaves_the_old_output_untouched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "m.gguf"
    out.write_bytes(b"old")
    calls = []

    def failing(array: np.ndarray, qtype: Q) -> np.ndarray:
        calls.append(qtype)
        if len(calls) == 3:
            raise OSError("disk full")
        return encode(array, qtype)

    monkeypatch.setattr(quantizer_module, "encode", failing)
    with pytest.raises(OSError):
        quantize_model(fixture_model("tiny-llama").hf_dir, out, "q8_0")
    assert out.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def test_sentencepiece_style_tokenizer_is_refused(tmp_path: Path) -> None:
    tok = {"model": {"type": "BPE", "byte_fallback": True, "vocab": {"a": 0}, "merges": []},
           "pre_tokenizer": {"type": "Metaspace"}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(UnsupportedModelError, match="byte-level BPE"):
        add_hf_tokenizer(gguf.GGUFWriter(None, "llama"), tmp_path, 8)


# ---- command line ------------------------------------------------------------------------


def mlxr(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(MLXR), *args], env=env, capture_output=True, text=True, timeout=120, check=False)


def test_cli_quantizes_and_registers(tmp_path: Path) -> None:
    home, out = tmp_path / "home", tmp_path / "tiny-q4km.gguf"
    env = {**os.environ, "MLXR_HOME": str(home)}
    src = str(fixture_model("tiny-qwen2").hf_dir)
    run = mlxr(env, "quantize", src, "--type", "q4_k_m", str(out), "--register", "tiny:q4km")
    assert run.returncode == 0, run.stderr
    assert "[ 1/26]" in run.stderr and "[26/26]" in run.stderr and "fallback for Q4_K" in run.stderr
    assert "registered tiny:q4km" in run.stdout
    assert "tiny:q4km" in mlxr(env, "list").stdout
    bad = mlxr(env, "quantize", src, "--type", "q3_k", str(tmp_path / "x.gguf"))
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_cli_types_match_the_quantizer() -> None:
    from mlxr.cli.quantize import TYPES

    assert set(TYPES) == set(FILE_TYPES)
