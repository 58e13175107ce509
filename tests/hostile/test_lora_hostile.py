"""Hostile LoRA adapters: each is a clear error naming the adapter and what was wrong (a 400 from
/v1/load_lora_adapter, a failed start for --lora), and the server keeps serving: ranks over
--max-lora-rank (in the config or only in the tensors, PEFT or GGUF), shapes the base does not
have, truncated safetensors, a config that is not JSON, a target module that does not exist, a
GGUF that is not an adapter; and the file bounds (bytes, tensors) hold before anything is read."""
from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest

import lora_files as bad
from lora_fixtures import peft_adapter
from model_fixtures import fixture_model
from server_harness import free_port, running_server, server_command

from mlxr.errors import AdapterError
from mlxr.formats.lora_adapter import LoRABounds, read_adapter

LLAMA = fixture_model("tiny-llama")


@pytest.fixture(scope="module")
def good() -> Path:
    return peft_adapter(LLAMA.hf_dir, "r4-qv")


CASES = {
    "rank-over-bound": (lambda g, d: peft_adapter(LLAMA.hf_dir, "r16-mlp-rslora"), "rank r=16 is over --max-lora-rank 8"),
    "rank-bomb-tensors": (lambda g, d: bad.rank_bomb_tensors(g, d, 4096), "over --max-lora-rank 8"),
    "gguf-rank-bomb": (lambda g, d: bad.gguf_rank_bomb(d.with_suffix(".gguf"), 1 << 20), "--max-lora-rank 8"),
    "wrong-shape": (lambda g, d: bad.wrong_shape(g, d), "the base's projection is"),
    "truncated": (lambda g, d: bad.truncated(g, d), "lies outside the file"),
    "config-not-json": (lambda g, d: bad.config_not_json(g, d), "not valid JSON"),
    "unknown-target": (lambda g, d: bad.with_config(g, d, target_modules=["q_proj", "nonexistent_proj"]),
                       "target module 'nonexistent_proj' does not exist"),
    "unknown-module": (lambda g, d: bad.no_such_module(g, d), "is not a projection of the base model"),
    "gguf-not-adapter": (lambda g, d: Path(LLAMA.gguf_path), "is not a GGUF LoRA adapter"),
    "dora": (lambda g, d: bad.with_config(g, d, use_dora=True), "use_dora=True is not supported"),
    "missing": (lambda g, d: d / "nothing-here", "neither a PEFT directory nor a GGUF file"),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    with running_server(home, "--model", str(LLAMA.hf_dir), "--enable-lora", "--max-lora-rank", "8") as url:
        yield url


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_adapter_is_a_400_naming_it_and_the_server_keeps_serving(case, server, good, tmp_path):
    make, message = CASES[case]
    path = make(good, tmp_path / case)
    r = httpx.post(server + "/v1/load_lora_adapter", json={"lora_name": case, "lora_path": str(path)}, timeout=60)
    assert r.status_code == 400, r.text
    assert message in r.text and repr(case)[1:-1] in r.text
    models = httpx.get(server + "/v1/models").json()["data"]
    assert case not in {m["id"] for m in models}
    ok = httpx.post(server + "/v1/completions", json={"model": models[0]["id"], "prompt": [7, 300, 45], "max_tokens": 4},
                    timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4


def test_a_good_adapter_still_loads_after_them(server, good):
    r = httpx.post(server + "/v1/load_lora_adapter", json={"lora_name": "fine", "lora_path": str(good)}, timeout=60)
    assert r.status_code == 200, r.text
    out = httpx.post(server + "/v1/completions", json={"model": "fine", "prompt": [7, 300, 45], "max_tokens": 4},
                     timeout=60)
    assert out.status_code == 200


def test_a_bad_adapter_at_start_stops_the_start_naming_it(tmp_path, good):
    broken = bad.truncated(good, tmp_path / "broken")
    cmd = server_command(tmp_path / "home", free_port(), "--model", str(LLAMA.hf_dir), "--lora", f"mine={broken}")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert res.returncode != 0
    assert "LoRA adapter 'mine'" in res.stdout + res.stderr


def test_file_bounds_hold_before_the_weights_are_read(good):
    with pytest.raises(AdapterError, match="over the bound of 100 \\(lora_max_bytes\\)"):
        read_adapter("big", good, LoRABounds(max_bytes=100))
    with pytest.raises(AdapterError, match="more than 3 tensors"):
        read_adapter("many", good, LoRABounds(max_tensors=3))
    assert len(read_adapter("fine", good, LoRABounds()).pairs) == 4  # q and v of 2 layers
