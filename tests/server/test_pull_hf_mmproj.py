"""`mlxr pull hf.co/OWNER/REPO:QUANT` of a GGUF repository that holds mmproj files, against the
fake hub over real HTTP: the F16 projector is fetched beside the model and registered as its
projector (as `llama-server -hf` picks it), the others are never fetched, and no mmproj file is
taken for the model even where its name carries the quant tag."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_hub import COMMIT, FakeHub, FakeRepo
from model_fixtures import FIXTURES

from mlxr.registry import Registry

ROOT = Path(__file__).resolve().parents[2]
REPO = "test-org/Tiny-Llava-GGUF"


@pytest.fixture(scope="module")
def files():
    from mlxr.testing.llama_cpp_convert import ConverterUnavailable
    from mlxr.testing.llava_mmproj_fixtures import llama_cpp_llava

    try:
        return llama_cpp_llava(FIXTURES)
    except ConverterUnavailable as e:
        pytest.skip(str(e))


def _pull(hub: FakeHub, ref: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(home / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1",
           "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "mlxr.cli", "pull", ref, "--home", str(home)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=180)


def test_pull_fetches_the_f16_mmproj_and_registers_it_as_the_projector(files, tmp_path):
    model, mmproj = files
    home = tmp_path / "home"
    with FakeHub() as hub:
        hub.repos[REPO] = FakeRepo({"Tiny-Llava.F32.gguf": model.read_bytes(), "Tiny-Llava.Q4_K_M.gguf": b"not this",
                                    "mmproj-Tiny-Llava-F32.gguf": b"not this projector",
                                    "mmproj-Tiny-Llava-F16.gguf": mmproj.read_bytes()})
        done = _pull(hub, f"hf.co/{REPO}:F32", home)
        assert done.returncode == 0, done.stderr
        assert not hub.downloads("mmproj-Tiny-Llava-F32.gguf") and not hub.downloads("Tiny-Llava.Q4_K_M.gguf")
    record = Registry(home).resolve(f"hf.co/{REPO.lower()}:f32")
    fetched = home / "models" / "hf.co" / REPO / COMMIT / "mmproj-Tiny-Llava-F16.gguf"
    assert record.projector == fetched.resolve() and fetched.read_bytes() == mmproj.read_bytes()
    assert record.size_bytes == model.stat().st_size + mmproj.stat().st_size
    from mlxr.server.ollama.model_info import capabilities, read_model

    args, template = read_model(record)
    assert args.vision is not None and args.vision.projector == "llava"
    assert "vision" in capabilities(template or "", args)


def test_pull_takes_the_first_mmproj_without_a_half_precision_one(files, tmp_path):
    model, mmproj = files
    home = tmp_path / "home"
    with FakeHub() as hub:
        hub.repos[REPO] = FakeRepo({"Tiny-Llava.F32.gguf": model.read_bytes(), "mmproj-a-F32.gguf": mmproj.read_bytes(),
                                    "mmproj-b-Q8_0.gguf": b"not this projector"})
        done = _pull(hub, f"hf.co/{REPO}", home)
        assert done.returncode == 0, done.stderr
        assert not hub.downloads("mmproj-b-Q8_0.gguf")
    record = Registry(home).resolve(f"hf.co/{REPO.lower()}:latest")
    assert record.projector is not None and record.projector.name == "mmproj-a-F32.gguf"


def test_a_repository_of_projectors_only_is_refused(files, tmp_path):
    with FakeHub() as hub:
        hub.repos[REPO] = FakeRepo({"mmproj-F16.gguf": files[1].read_bytes()})
        done = _pull(hub, f"hf.co/{REPO}", tmp_path / "home")
    assert done.returncode == 1 and "holds only projectors (mmproj files), no model" in done.stderr
