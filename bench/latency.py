"""Single-stream latency: prefill tok/s and decode tok/s, MLXR beside HF transformers on the
same weights in the same run. Writes bench/results/latency-*.json and prints a table.

  python bench/latency.py --model gemma3-270m --prompt-len 128 --gen-len 64
  python bench/latency.py --model tinyllama-shape --dtype bfloat16
"""
from __future__ import annotations

import argparse
import time

import torch

from common import device_name, dtype_label, median, print_table, sync, write_result


def model_paths(model: str) -> tuple[str, dict]:
    """MLXR reference and the kwargs that make HF transformers load the same weights."""
    if model == "gemma3-270m":
        from mlxr.loader.resolve import bundled_model_path

        path = bundled_model_path()
        return "gemma3-270m", {"pretrained_model_name_or_path": str(path.parent), "gguf_file": path.name}
    from mlxr.testing.fixtures import CONFIGS, fixture_paths

    if model in CONFIGS:
        paths = fixture_paths(model)
        return str(paths.hf_dir), {"pretrained_model_name_or_path": str(paths.hf_dir)}
    return model, {"pretrained_model_name_or_path": model}


def prompt_ids(vocab: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(10, vocab - 10, (n,), generator=g).tolist()


def bench_mlxr(llm, device: str, ids: list[int], gen: int, runs: int) -> dict:
    from mlxr import SamplingParams

    params = SamplingParams(max_tokens=gen, temperature=0.0, ignore_eos=True)
    prefill, decode = [], []
    for i in range(runs + 1):
        engine = llm.engine
        # Each run a different prompt (rotated): the same one would be served from the
        # prefix cache, and only its last partial block would be timed.
        engine.add_request(f"lat-{i}", ids[i:] + ids[:i], params, stream_deltas=True)
        sync(device)
        t0 = time.perf_counter()
        first = None
        n = 0
        while engine.has_unfinished():
            for out in engine.step():
                n += len(out.outputs[0].token_ids)
                if first is None and n:  # the token is on the host: no device sync (one may be queued)
                    first = time.perf_counter()
        sync(device)
        t1 = time.perf_counter()
        if i:  # the first run warms up
            prefill.append(len(ids) / (first - t0))
            decode.append((n - 1) / (t1 - first))
    return {"prefill_tok_s": median(prefill), "decode_tok_s": median(decode)}


def bench_hf(hf_kwargs: dict, dtype, device: str, ids: list[int], gen: int, runs: int) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(**hf_kwargs, dtype=dtype).to(device).eval()
    x = torch.tensor([ids], device=device)
    prefill, decode = [], []
    with torch.inference_mode():
        for i in range(runs + 1):
            sync(device)
            t0 = time.perf_counter()
            model(x)
            sync(device)
            t1 = time.perf_counter()
            model.generate(x, max_new_tokens=gen, min_new_tokens=gen, do_sample=False)
            sync(device)
            t2 = time.perf_counter()
            if i:
                prefill.append(len(ids) / (t1 - t0))
                # generate = one prefill + (gen - 1) decode steps
                decode.append((gen - 1) / max(1e-9, (t2 - t1) - (t1 - t0)))
    return {"prefill_tok_s": median(prefill), "decode_tok_s": median(decode)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, help="default: MLXR's device default; HF gets float32 on CPU")
    p.add_argument("--weight-dtype", default=None)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--gen-len", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--no-hf", action="store_true")
    a = p.parse_args()
    dtype = getattr(torch, a.dtype) if a.dtype else None
    hf_dtype = dtype or (torch.float32 if a.device == "cpu" else torch.bfloat16)
    ref, hf_kwargs = model_paths(a.model)
    from mlxr import LLM

    llm = LLM(ref, dtype=dtype, device=a.device, weight_dtype=a.weight_dtype,
              max_num_batched_tokens=max(2048, a.prompt_len))
    mlxr_dtypes = dtype_label(llm)
    ids = prompt_ids(llm.args.vocab_size, a.prompt_len)
    rows = [{"engine": "mlxr", "dtype": mlxr_dtypes, **bench_mlxr(llm, a.device, ids, a.gen_len, a.runs)}]
    del llm
    if not a.no_hf:
        rows.append({"engine": "hf-transformers", "dtype": str(hf_dtype).replace("torch.", ""),
                     **bench_hf(hf_kwargs, hf_dtype, a.device, ids, a.gen_len, a.runs)})
    if len(rows) == 2:
        rows[0]["decode_vs_hf"] = rows[0]["decode_tok_s"] / rows[1]["decode_tok_s"]
        rows[0]["prefill_vs_hf"] = rows[0]["prefill_tok_s"] / rows[1]["prefill_tok_s"]
    meta = {"model": a.model, "device": device_name(a.device),
            "prompt_len": a.prompt_len, "gen_len": a.gen_len, "runs": a.runs, "batch": 1}
    path = write_result("latency", {**meta, "results": rows})
    print_table(rows, ["engine", "dtype", "prefill_tok_s", "decode_tok_s", "prefill_vs_hf", "decode_vs_hf"])
    print(f"{meta} -> {path}")


if __name__ == "__main__":
    main()
