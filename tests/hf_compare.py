"""One model against HF transformers fp32 on a tiny random model: logits over a prompt and 16
decode steps (||d||/||ref|| <= 1e-4) and 32 greedy tokens, from the safetensors directory or a
GGUF (llama.cpp's own converter's, or MLXR's)."""
from __future__ import annotations

import inspect

import pytest
import torch

from mlxr import SamplingParams
from model_fixtures import FIXTURES
from paged_probe import paged_logits, rel_err

PROMPT = [7, 300, 45, 99, 12, 250, 3, 77, 180, 31, 64, 400, 9, 11, 222, 5, 88, 123, 301, 17, 42, 256, 19, 73]


def arch_fixture(name: str):
    """The HF directory of an architecture fixture (mlxr/testing/arch_fixtures.py)."""
    from mlxr.testing.arch_fixtures import arch_fixture_dir

    return arch_fixture_dir(name, FIXTURES)


def llama_cpp_gguf(hf_dir, outtype: str = "f32") -> str:
    """llama.cpp's GGUF of an HF fixture; skips where its converter cannot be fetched (no PyPI)."""
    from mlxr.testing.llama_cpp_convert import ConverterUnavailable, llama_cpp_gguf

    try:
        return str(llama_cpp_gguf(hf_dir, FIXTURES, outtype))
    except ConverterUnavailable as e:
        pytest.skip(str(e))


def hf_model(hf_dir, **config_changes):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager",
                                                **config_changes).eval()


def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    """n argmax tokens through HF's own KV cache. Not generate(min_new_tokens=n): that masks EOS,
    where MLXR's ignore_eos only keeps going past it, so a model whose argmax is EOS would differ."""
    out: list[int] = []
    cache_arg = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    with torch.inference_mode():
        step = hf(torch.tensor([ids]), use_cache=True)
        for i in range(n):
            out.append(int(step.logits[0, -1].argmax()))
            if i + 1 < n:
                step = hf(torch.tensor([out[-1:]]), use_cache=True, **{cache_arg: step.past_key_values})
    return out


def check_logits(hf, llm, prompt: list[int] = PROMPT, n_decode: int = 16) -> None:
    ids = prompt + hf_greedy(hf, prompt, n_decode)
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits[0]
    ours = paged_logits(llm, ids, len(prompt))
    assert ours.shape == ref.shape
    assert rel_err(ours[: len(prompt)], ref[: len(prompt)]) <= 1e-4
    assert rel_err(ours[len(prompt):], ref[len(prompt):]) <= 1e-4


def check_greedy(hf, llm, prompt: list[int] = PROMPT) -> None:
    want = hf_greedy(hf, prompt, 32)
    got = llm.generate([prompt], SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))[0]
    assert got.outputs[0].token_ids == want


def llama_server_binary() -> str:
    """The llama-server binary MLXR_LLAMA_SERVER names; skips the test where there is none."""
    import os
    from pathlib import Path

    binary = os.environ.get("MLXR_LLAMA_SERVER")
    if not binary or not Path(binary).is_file():
        pytest.skip("MLXR_LLAMA_SERVER names no llama-server binary")
    return binary


def llama_server_tokens(gguf: str, n: int) -> list[int]:
    """n greedy tokens of PROMPT from llama.cpp's own llama-server on the file (skips without one)."""
    import json
    import sys
    import urllib.request
    from pathlib import Path

    binary = llama_server_binary()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "peers"))
    from llama_server import LlamaServer

    body = {"prompt": PROMPT, "n_predict": n, "temperature": 0.0, "top_k": 1, "cache_prompt": False,
            "return_tokens": True, "ignore_eos": True}
    # An f32 K/V cache: its default f16 one rounds where MLXR and HF do not.
    with LlamaServer(binary, gguf, False, 1, 256, ["-ctk", "f32", "-ctv", "f32"]) as server:
        req = urllib.request.Request(server.url + "/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())["tokens"]
