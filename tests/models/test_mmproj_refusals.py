"""A malformed or mismatched mmproj file is refused at import with the reason (formats/mmproj.py
through the registry and `mlxr import --mmproj`), before anything is registered; a good one is
registered with its model, and /api/show says the pair takes images."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
from mmproj_files import rewrite
from model_fixtures import FIXTURES, ROOT, fixture_model

from mlxr.errors import InvalidParameterError, ModelFormatError
from mlxr.registry import Registry


@pytest.fixture(scope="module")
def files():
    from mlxr.testing.llama_cpp_convert import ConverterUnavailable
    from mlxr.testing.mmproj_fixtures import llama_cpp_vlm

    try:
        return llama_cpp_vlm("tiny-gemma3-vlm-swa", FIXTURES)
    except ConverterUnavailable as e:
        pytest.skip(str(e))


BAD = {
    "projector type": ({"clip.projector_type": "llama4"}, (), {}, "projector type 'llama4' is not supported"),
    "no vision encoder": ({"clip.has_vision_encoder": False}, (), {}, "has no vision encoder"),
    "layer count": ({"clip.vision.block_count": 100_000}, (), {}, "block_count must be an integer in 1..256"),
    "patch grid": ({"clip.vision.image_size": 30}, (), {}, "not a whole number of 4-pixel patches"),
    "heads": ({"clip.vision.attention.head_count": 3}, (), {}, "does not split into 3 heads"),
    "std": ({"clip.vision.image_std": [0.5, 0.0, 0.5]}, (), {}, "image_std must be three numbers above 0"),
    "missing tensor": ({}, ("v.blk.1.attn_q.weight",), {}, "lacks tensors: v.blk.1.attn_q.weight"),
    "patch shape": ({}, (), {"v.patch_embd.weight": (32, 3, 2, 2)}, "v.patch_embd.weight has shape (32, 3, 2, 2)"),
    "width": ({"clip.vision.projection_dim": 48}, (), {}, "projects into 48 dimensions; the model's embeddings have 64"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_malformed_mmproj_is_refused_with_the_reason(files, tmp_path, case):
    model, mmproj = files
    metadata, drop, shapes, reason = BAD[case]
    bad = rewrite(mmproj, tmp_path / "bad-mmproj.gguf", metadata, drop, shapes)
    registry = Registry(tmp_path / "home")
    with pytest.raises(ModelFormatError, match=re.escape(reason)):
        registry.import_model(model, "vlm", projector=bad)
    assert registry.list() == []


def test_the_wrong_files_are_refused(files, tmp_path):
    model, mmproj = files
    registry = Registry(tmp_path / "home")
    with pytest.raises(ModelFormatError, match="is not an mmproj file: general.architecture is 'gemma3'"):
        registry.import_model(model, "vlm", projector=model)
    with pytest.raises(ModelFormatError, match="is a gemma3 projector; the model is llama"):
        registry.import_model(fixture_model("tiny-llama").gguf_path, "vlm", projector=mmproj)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(mmproj.read_bytes()[:5000])
    with pytest.raises(ModelFormatError):
        registry.import_model(model, "vlm", projector=truncated)
    with pytest.raises(InvalidParameterError, match="projector: .* does not exist"):
        registry.import_model(model, "vlm", projector=tmp_path / "absent.gguf")
    assert registry.list() == []


def test_cli_import_registers_the_pair_or_says_why_not(files, tmp_path):
    model, mmproj = files
    home = tmp_path / "home"
    bad = rewrite(mmproj, tmp_path / "bad-mmproj.gguf", {"clip.projector_type": "llama4"})
    cli = [sys.executable, "-m", "mlxr.cli", "import", "--home", str(home)]
    refused = subprocess.run([*cli, str(model), "--name", "vlm", "--mmproj", str(bad)],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "projector type 'llama4' is not supported" in refused.stderr
    done = subprocess.run([*cli, str(model), "--name", "vlm", "--mmproj", str(mmproj)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    record = Registry(home).resolve("vlm")
    assert record.projector == mmproj.resolve()
    assert record.size_bytes == model.stat().st_size + mmproj.stat().st_size
    from mlxr.server.ollama.model_info import capabilities, read_model

    args, template = read_model(record)
    assert args.vision is not None and args.vision.tokens_per_image == 16
    assert "vision" in capabilities(template or "", args)


@pytest.fixture(scope="module")
def llava_files():
    from mlxr.testing.llama_cpp_convert import ConverterUnavailable
    from mlxr.testing.llava_mmproj_fixtures import llama_cpp_llava

    try:
        return llama_cpp_llava(FIXTURES)
    except ConverterUnavailable as e:
        pytest.skip(str(e))


LLAVA_BAD = {
    "feature layer": ({"clip.vision.feature_layer": [3]}, (), {}, "feature_layer must be one layer in 1..2, got [3]"),
    "feature layers": ({"clip.vision.feature_layer": [1, 2]}, (), {}, "feature_layer must be one layer"),
    "class token": ({}, ("v.class_embd",), {}, "lacks tensors: v.class_embd"),
    "pre-norm": ({}, ("v.pre_ln.weight",), {}, "lacks tensors: v.pre_ln.weight"),
    "positions": ({}, (), {"v.position_embd.weight": (16, 32)}, "v.position_embd.weight has shape (16, 32), expected (17, 32)"),
    "projector width": ({}, (), {"mm.2.weight": (48, 64), "mm.2.bias": (48,)}, "projects into 48 dimensions"),
}


@pytest.mark.parametrize("case", list(LLAVA_BAD))
def test_a_malformed_llava_mmproj_is_refused_with_the_reason(llava_files, tmp_path, case):
    model, mmproj = llava_files
    metadata, drop, shapes, reason = LLAVA_BAD[case]
    bad = rewrite(mmproj, tmp_path / "bad-mmproj.gguf", metadata, drop, shapes)
    registry = Registry(tmp_path / "home")
    with pytest.raises(ModelFormatError, match=re.escape(reason)):
        registry.import_model(model, "llava", projector=bad)
    assert registry.list() == []


def test_a_llava_projector_is_refused_beside_gemma3(files, llava_files, tmp_path):
    registry = Registry(tmp_path / "home")
    with pytest.raises(ModelFormatError, match="is a llava projector; the model is gemma3"):
        registry.import_model(files[0], "vlm", projector=llava_files[1])
    record = registry.import_model(llava_files[0], "llava", projector=llava_files[1])
    assert record.projector == llava_files[1].resolve()


@pytest.fixture(scope="module")
def qwen_files():
    from mlxr.testing.llama_cpp_convert import ConverterUnavailable
    from mlxr.testing.mmproj_fixtures import llama_cpp_vlm

    try:
        return llama_cpp_vlm("tiny-qwen25-vl", FIXTURES)
    except ConverterUnavailable as e:
        pytest.skip(str(e))


QWEN_BAD = {
    "window pattern": ({"clip.vision.n_wa_pattern": None}, (), {}, "clip.vision.n_wa_pattern must be an integer in 1..3"),
    "silu": ({"clip.use_silu": False}, (), {}, "must say clip.use_silu true"),
    "second frame": ({}, ("v.patch_embd.weight.1",), {}, "lacks tensors: v.patch_embd.weight.1"),
    "merger width": ({}, (), {"mm.0.weight": (64, 64)}, "mm.0.weight has shape (64, 64), expected (128, 128)"),
}


@pytest.mark.parametrize("case", list(QWEN_BAD))
def test_a_malformed_qwen25_vl_mmproj_is_refused_with_the_reason(qwen_files, tmp_path, case):
    model, mmproj = qwen_files
    metadata, drop, shapes, reason = QWEN_BAD[case]
    bad = rewrite(mmproj, tmp_path / "bad-mmproj.gguf", metadata, drop, shapes)
    registry = Registry(tmp_path / "home")
    with pytest.raises(ModelFormatError, match=re.escape(reason)):
        registry.import_model(model, "qwen", projector=bad)
    assert registry.list() == []


def test_a_qwen25_vl_projector_pairs_only_with_its_language_model(files, qwen_files, tmp_path):
    registry = Registry(tmp_path / "home")
    with pytest.raises(ModelFormatError, match="is a qwen2_5_vl projector; the model is gemma3"):
        registry.import_model(files[0], "vlm", projector=qwen_files[1])
    record = registry.import_model(qwen_files[0], "qwen", projector=qwen_files[1])
    assert record.projector == qwen_files[1].resolve()
    from mlxr.server.ollama.model_info import capabilities, read_model

    args, template = read_model(registry.resolve("qwen"))
    assert args.vision.projector == "qwen2_5_vl" and args.vision.mrope_section == (2, 3, 3)
    assert "vision" in capabilities(template or "", args)


@pytest.mark.parametrize("sections,reason", [([2, 3, 2, 0], "do not cover the head's 8 rotary pairs"),
                                             ([2, 3, 3, 1], "must be three positive integers and a 0")])
def test_a_qwen2vl_gguf_with_bad_mrope_sections_is_refused(qwen_files, tmp_path, sections, reason):
    model, mmproj = qwen_files
    bad = rewrite(model, tmp_path / "bad.gguf", {"qwen2vl.rope.dimension_sections": sections})
    registry = Registry(tmp_path / "home")
    with pytest.raises(ModelFormatError, match=re.escape(reason)):
        registry.import_model(bad, "qwen", projector=mmproj)
    assert registry.list() == []
