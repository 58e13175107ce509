"""`mlxr perplexity` as a user runs it (a subprocess), against HF transformers scoring the same
chunks the way llama.cpp's llama-perplexity does."""
from __future__ import annotations

import json
import math

import torch
from model_fixtures import fixture_model
from test_cli import run

WORDS = "the cat sat on a mat while red dogs ran past green trees and blue birds sang".split()
TEXT = " ".join(WORDS[(7 * i + i // 5) % len(WORDS)] for i in range(400))
CTX = 64


def hf_perplexity(hf_dir, text: str, n_ctx: int) -> tuple[float, int]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id
    nll = []
    for start in range(0, len(ids) - n_ctx + 1, n_ctx):
        chunk = [tok.bos_token_id] + ids[start + 1: start + n_ctx]
        with torch.inference_mode():
            logp = torch.log_softmax(model(torch.tensor([chunk])).logits[0].float(), dim=-1)
        nll += [-logp[j, chunk[j + 1]].item() for j in range(n_ctx // 2, n_ctx - 1)]
    return math.exp(sum(nll) / len(nll)), len(nll)


def test_perplexity_matches_transformers_on_the_same_chunks(tmp_path):
    hf_dir = str(fixture_model("tiny-llama").hf_dir)
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    res = run(["perplexity", "--model", hf_dir, "--dtype", "float32", "--ctx", str(CTX), "--json", str(text)])
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    want, scored = hf_perplexity(hf_dir, TEXT, CTX)
    assert got["chunks"] >= 3 and got["scored_tokens"] == scored
    assert math.isclose(got["ppl"], want, rel_tol=1e-4), (got, want)
    assert 0 < got["stderr"] < got["ppl"]


def test_running_estimate_then_final_line(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    res = run(["perplexity", "--model", str(fixture_model("tiny-llama").gguf_path), "--ctx", str(CTX),
               "--chunks", "2", str(text)])
    assert res.returncode == 0, res.stderr
    running, final = res.stdout.strip().split("\n")
    assert running.startswith("[1]") and running.count("[") == 2 and "[2]" in running
    assert final.startswith("Final estimate: PPL = ") and "+/-" in final
    assert final.split()[4] == running.split("[2]")[1].rstrip(",")  # the last running figure


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    model = ["--model", str(fixture_model("tiny-llama").gguf_path)]
    short = tmp_path / "short.txt"
    short.write_text("too short")
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00text")
    cases = [([str(short)], "fewer than one chunk"), ([str(binary)], "not UTF-8"),
             (["--ctx", "4096", str(short)], "over the model's context"), (["--ctx", "4", str(short)], "at least"),
             ([str(tmp_path / "missing.txt")], "cannot read")]
    for args, words in cases:
        res = run(["perplexity", *model, *args])
        assert res.returncode == 2 and words in res.stderr and "Traceback" not in res.stderr, (args, res.stderr)
