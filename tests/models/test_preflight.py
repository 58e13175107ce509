"""import / create / pull refuse a model that would not load: the loader's preflight (tensor
names against the layer count, the tokenizer) runs before the registry records anything."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from model_fixtures import fixture_model

from mlxr.errors import ModelFormatError
from mlxr.loader.preflight import check_loadable
from mlxr.registry import Registry

ROOT = Path(__file__).resolve().parents[2]


def _broken_copies(tmp_path: Path) -> dict[str, Path]:
    src = fixture_model("tiny-llama").hf_dir
    layers, tokenizer = tmp_path / "layers", tmp_path / "tokenizer"
    for d in (layers, tokenizer):
        shutil.copytree(src, d)
    config = json.loads((layers / "config.json").read_text())
    (layers / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    (tokenizer / "tokenizer.json").write_text('{"model": {"type": "NoSuchModel"}}')
    return {"layers": layers, "tokenizer": tokenizer}


@pytest.mark.parametrize("kind, message", [("layers", "declares 3 layers"), ("tokenizer", "tokenizer")])
def test_registry_import_with_the_preflight_refuses(tmp_path: Path, kind: str, message: str) -> None:
    path = _broken_copies(tmp_path)[kind]
    reg = Registry(tmp_path / "home")
    reg.import_model(path, "unchecked")  # the registry's own checks pass it...
    with pytest.raises(ModelFormatError, match=message):
        reg.import_model(path, "checked", check=check_loadable)  # ...the loader's do not
    assert [r.name for r in reg.list()] == ["unchecked:latest"]


def test_cli_import_runs_the_preflight(tmp_path: Path) -> None:
    path = _broken_copies(tmp_path)["tokenizer"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "mlxr.cli", "import", str(path), "--home", str(tmp_path / "h")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "tokenizer" in done.stderr
    assert Registry(tmp_path / "h").list() == []
