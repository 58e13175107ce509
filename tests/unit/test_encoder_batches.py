"""The encoder's batch plan and a sentence-transformers directory's pooling config (torch-free)."""
from __future__ import annotations

import json

import pytest

from mlxr.engine.encoder.batches import plan_batches
from mlxr.errors import ModelFormatError, UnsupportedModelError
from mlxr.formats.sentence_config import read_sentence_config


def test_batches_keep_rows_times_width_within_the_bound() -> None:
    lengths = [5, 30, 7, 7, 12, 1, 30]
    batches = plan_batches(lengths, 60, 8)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 60
    assert plan_batches([100], 10, 8) == [[0]]  # an input alone may pass the bound
    assert all(len(b) <= 2 for b in plan_batches([1] * 9, 1000, 2))


def _st_dir(tmp_path, pooling: dict, normalize: bool = True):
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return tmp_path


def test_both_pooling_config_forms(tmp_path) -> None:
    old = _st_dir(tmp_path / "a", {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False})
    assert read_sentence_config(old).pooling == "mean" and read_sentence_config(old).normalize
    new = _st_dir(tmp_path / "b", {"pooling_mode": "lasttoken"}, normalize=False)
    assert (read_sentence_config(new).pooling, read_sentence_config(new).normalize) == ("last", False)
    assert read_sentence_config(tmp_path).pooling is None  # no modules.json: the loader's default


def test_unsupported_pooling_is_named(tmp_path) -> None:
    with pytest.raises(UnsupportedModelError, match="max"):
        read_sentence_config(_st_dir(tmp_path / "a", {"pooling_mode": "max"}))
    bad = _st_dir(tmp_path / "b", {"pooling_mode": "mean"})
    (bad / "modules.json").write_text(json.dumps([{"type": "x.Pooling", "path": "../../etc"}]))
    with pytest.raises(ModelFormatError, match="inside the model directory"):
        read_sentence_config(bad)


def _with_dense(tmp_path, config: dict):
    root = _st_dir(tmp_path, {"pooling_mode": "mean"})
    modules = json.loads((root / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (root / "modules.json").write_text(json.dumps(modules))
    (root / "2_Dense").mkdir()
    (root / "2_Dense" / "config.json").write_text(json.dumps(config))
    return root


def test_dense_modules_are_read_in_order_and_bounded(tmp_path) -> None:
    identity = "torch.nn.modules.linear.Identity"
    dense = read_sentence_config(_with_dense(tmp_path / "a", {"in_features": 8, "out_features": 16, "bias": False,
                                                              "activation_function": identity})).dense
    assert [(d.path, d.in_features, d.out_features, d.bias, d.activation) for d in dense] == [
        ("2_Dense", 8, 16, False, "identity")]
    default = read_sentence_config(_with_dense(tmp_path / "b", {"in_features": 8, "out_features": 4})).dense[0]
    assert (default.bias, default.activation) == (True, "tanh")  # sentence-transformers' defaults
    with pytest.raises(UnsupportedModelError, match="GELU"):
        read_sentence_config(_with_dense(tmp_path / "c", {"in_features": 8, "out_features": 4,
                                                          "activation_function": "torch.nn.GELU"}))
    with pytest.raises(ModelFormatError, match="out_features"):
        read_sentence_config(_with_dense(tmp_path / "d", {"in_features": 8, "out_features": 1 << 30}))
