"""Greedy token ids of every fixture (and the bundled model on the CPU) through the public API,
as JSON, so two trees can be compared token for token:

    PYTHONPATH=old-tree python bench/greedy_identity.py --out old.json
    PYTHONPATH=new-tree python bench/greedy_identity.py --out new.json --compare old.json

The prompts mix lengths (one token, chunked prefill, block boundaries), in one batch."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

FIXTURES = ["tiny-llama", "tiny-llama-tied", "tiny-llama3", "tiny-qwen2", "tiny-gemma3"]


def prompts(vocab: int) -> list[list[int]]:
    lengths = [1, 3, 15, 16, 17, 40, 100, 230]
    return [[(7 * i + 13 * j) % (vocab - 10) + 5 for j in range(n)] for i, n in enumerate(lengths)]


def run(ref: str, device: str, dtype, max_tokens: int, knobs: dict) -> list[list[int]]:
    from mlxr import LLM, SamplingParams

    llm = LLM(ref, dtype=dtype, device=device, max_num_batched_tokens=64, **knobs)
    # (The trees before the engine-core split have neither llm.args nor shutdown.)
    vocab = llm.args.vocab_size if hasattr(llm, "args") else llm.loaded.args.vocab_size
    outs = llm.generate(prompts(vocab), SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    if hasattr(llm, "shutdown"):
        llm.shutdown()
    return [o.outputs[0].token_ids for o in outs]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                   help="activations (default: float32 on the CPU, bfloat16 on CUDA)")
    p.add_argument("--out", required=True)
    p.add_argument("--compare", default=None)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--bundled", action="store_true", help="also the bundled Gemma 3 270M (CPU)")
    p.add_argument("--engine-process", choices=["on", "off"], default=None,
                   help="where the engine core runs (trees with the split only; default: the engine's choice)")
    a = p.parse_args()
    knobs = {} if a.engine_process is None else {"engine_process": a.engine_process == "on"}
    from mlxr.testing.fixtures import fixture_paths

    dtype = getattr(torch, a.dtype) if a.dtype else torch.float32 if a.device == "cpu" else torch.bfloat16
    got = {}
    for name in FIXTURES:
        paths = fixture_paths(name, Path(".fixtures"))
        got[name] = run(str(paths.hf_dir), a.device, dtype, a.max_tokens, knobs)
        got[name + ":gguf"] = run(str(paths.gguf_path), a.device, dtype, a.max_tokens, knobs)
    if a.bundled:
        got["gemma3-270m"] = run("gemma3-270m", a.device, None, a.max_tokens, knobs)
    Path(a.out).write_text(json.dumps(got))
    if a.compare:
        want = json.loads(Path(a.compare).read_text())
        diff = [k for k in want if want[k] != got.get(k)]
        print(f"{len(want) - len(diff)}/{len(want)} models token-identical" + (f"; differ: {diff}" if diff else ""))
        sys.exit(1 if diff else 0)
    print(f"wrote {len(got)} models' greedy tokens to {a.out}")


if __name__ == "__main__":
    main()
