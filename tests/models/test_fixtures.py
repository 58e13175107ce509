"""The fixture writer and the GGUF -> HF weight mapping, checked against each other and
against Hugging Face transformers (which loads both the HF directory and the GGUF)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from mlxr.errors import ModelFormatError
from mlxr.formats.gguf import open_gguf
from mlxr.formats.safetensors_dir import iter_safetensors
from mlxr.loader.gguf_weights import iter_gguf_hf_weights
from mlxr.models.model_args import args_from_gguf, args_from_hf
from mlxr.testing.fixtures import CONFIGS, FixturePaths, fixture_paths, write_fixture

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2] / ".fixtures"
TINY = ["tiny-llama", "tiny-llama-tied", "tiny-llama3", "tiny-qwen2", "tiny-gemma3"]


def paths(name: str, gguf_type: str = "f32") -> FixturePaths:
    return fixture_paths(name, ROOT, gguf_type)


def hf_weights(p: FixturePaths) -> dict[str, np.ndarray]:
    return {t.name: t.array for t in iter_safetensors(p.hf_dir)}


@pytest.mark.parametrize("name", TINY)
def test_gguf_maps_back_to_the_same_hf_weights(name: str) -> None:
    p = paths(name)
    want = hf_weights(p)
    with open_gguf(p.gguf_path) as f:
        got = dict(iter_gguf_hf_weights(f, args_from_gguf(f)))
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key].dtype == np.float32
        np.testing.assert_array_equal(got[key], value, err_msg=key)


@pytest.mark.parametrize("name", TINY)
def test_gguf_and_hf_config_give_the_same_args(name: str) -> None:
    p = paths(name)
    hf = args_from_hf(json.loads((p.hf_dir / "config.json").read_text()))
    with open_gguf(p.gguf_path) as f:
        gg = args_from_gguf(f)
    diff = {fld.name for fld in dataclasses.fields(hf) if fld.compare and getattr(hf, fld.name) != getattr(gg, fld.name)}
    # llama.cpp also stops on <|endoftext|>, which config.json does not list
    assert diff <= {"eos_token_ids"} and set(hf.eos_token_ids) <= set(gg.eos_token_ids)


def test_f16_gguf_is_close(tmp_path: Path) -> None:
    p = paths("tiny-gemma3", "f16")
    want = hf_weights(p)
    with open_gguf(p.gguf_path) as f:
        assert f.tensor_info("token_embd.weight").ggml_type == "F16"
        assert f.tensor_info("output_norm.weight").ggml_type == "F32"
        got = dict(iter_gguf_hf_weights(f, args_from_gguf(f)))
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-3, atol=1e-4, err_msg=key)


def test_writer_is_deterministic(tmp_path: Path) -> None:
    a, b = write_fixture("tiny-qwen2", tmp_path / "a"), write_fixture("tiny-qwen2", tmp_path / "b")
    for rel in ["model.safetensors", "tokenizer.json", "config.json", "tokenizer_config.json"]:
        assert (a.hf_dir / rel).read_bytes() == (b.hf_dir / rel).read_bytes(), rel
    digest = [hashlib.sha256(x.gguf_path.read_bytes()).hexdigest() for x in (a, b)]
    assert digest[0] == digest[1]


def test_norms_and_biases_are_random() -> None:
    w = hf_weights(paths("tiny-qwen2"))
    assert 0.05 < np.std(w["model.norm.weight"]) < 0.2 and abs(np.mean(w["model.norm.weight"]) - 1) < 0.1
    assert np.std(w["model.layers.0.self_attn.q_proj.bias"]) > 0.05
    g = hf_weights(paths("tiny-gemma3"))
    assert abs(np.mean(g["model.layers.0.input_layernorm.weight"])) < 0.1


# ---- mapping errors -------------------------------------------------------------------


def _rewrite(src: Path, dst: Path, drop: str | None = None, add: str | None = None,
             reshape: str | None = None) -> Path:
    """Copy a GGUF with one tensor dropped, added or cut short."""
    import gguf

    with open_gguf(src) as f:
        w = gguf.GGUFWriter(str(dst), f.architecture)
        for key, value in f.metadata.items():
            if key != "general.architecture":
                w.add_key_value(key, value, gguf.GGUFValueType(f.value_types[key]))
        for name in f.tensor_names:
            if name != drop:
                value = f.load(name)
                w.add_tensor(name, value[:-1] if name == reshape else value)
        if add:
            w.add_tensor(add, np.zeros(4, np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return dst


@pytest.mark.parametrize("change, fragment", [
    ({"drop": "blk.1.attn_k.weight"}, "model.layers.1.self_attn.k_proj.weight"),
    ({"add": "blk.0.mystery.weight"}, "blk.0.mystery.weight"),
    ({"add": "blk.9.attn_q.weight"}, "layer 9"),
    ({"add": "vision.patch.weight"}, "vision.patch.weight"),
    ({"reshape": "blk.0.ffn_up.weight"}, "shape"),
])
def test_mapping_errors_name_the_tensor(tmp_path: Path, change: dict, fragment: str) -> None:
    bad = _rewrite(paths("tiny-llama").gguf_path, tmp_path / "bad.gguf", **change)
    with open_gguf(bad) as f, pytest.raises(ModelFormatError, match=fragment.replace(".", r"\.")):
        # A layer past the declared count is refused as the config is read (before any mapping).
        list(iter_gguf_hf_weights(f, args_from_gguf(f)))


# ---- Hugging Face transformers as the reference -----------------------------------------


@pytest.fixture(scope="module")
def transformers_mod():
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers


# What transformers' GGUF loader cannot know: llama.cpp keeps no query_pre_attn_scalar
# (it uses head_dim) and stores llama3 rope scaling as a rope_freqs tensor it ignores.
_GGUF_OVERRIDES = {
    "tiny-gemma3": {"query_pre_attn_scalar": 32},
    "tiny-llama3": {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 64}},
}


@pytest.mark.parametrize("name", TINY)
def test_transformers_loads_both_and_agrees(transformers_mod, name: str) -> None:
    import torch

    p = paths(name)
    auto = transformers_mod.AutoModelForCausalLM
    model, info = auto.from_pretrained(p.hf_dir, output_loading_info=True, dtype=torch.float32)
    assert not any(info.values()), info
    tok = transformers_mod.AutoTokenizer.from_pretrained(p.hf_dir)
    assert len(tok) == CONFIGS[name].config["vocab_size"]
    ids = tok("The quick brown fox jumps over the lazy dog, then naps in the sun. café 🙂")["input_ids"]
    assert len(ids) > 20  # longer than tiny-gemma3's sliding window of 8
    gg = auto.from_pretrained(p.gguf_path.parent, gguf_file=p.gguf_path.name, dtype=torch.float32,
                              **_GGUF_OVERRIDES.get(name, {}))
    with torch.no_grad():
        a = model(torch.tensor([ids])).logits
        b = gg(torch.tensor([ids])).logits
    assert a.std() > 0.3  # logits carry signal
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, marker", [("tiny-llama", "<|assistant|>"), ("tiny-qwen2", "<|im_start|>assistant"),
                                          ("tiny-gemma3", "<start_of_turn>model")])
def test_tokenizer_and_chat_template(transformers_mod, name: str, marker: str) -> None:
    p = paths(name)
    tok = transformers_mod.AutoTokenizer.from_pretrained(p.hf_dir)
    text = tok.apply_chat_template([{"role": "user", "content": "Hi there"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.endswith(marker + "\n") and "Hi there" in text
    gguf_tok = transformers_mod.AutoTokenizer.from_pretrained(p.gguf_path.parent, gguf_file=p.gguf_path.name)
    sample = "Hello world, naïve café 日本 🙂 <end_of_turn>"
    assert tok(sample)["input_ids"] == gguf_tok(sample)["input_ids"]
    assert tok.decode(tok(sample, add_special_tokens=False)["input_ids"]) == sample
