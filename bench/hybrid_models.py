"""Hybrid models (Qwen3.5: Gated DeltaNet layers with a recurrent state, and gated attention) on
the CPU, MLXR beside llama.cpp on the same GGUF, run by run interleaved.

A random-weight Qwen3.5 (dense, or --moe) of a chosen size is written by transformers' own class
and converted by llama.cpp's own convert_hf_to_gguf.py (f32, --no-mtp), once, under --work.
Each run times, on that file: MLXR's prefill of --prompt tokens (a generate of one token), its
decode at batch 1 from a 16-token prompt (--gen tokens after the first, over the time after the
first) and at --batch requests at once (all tokens after each request's first, over the time
after the prefill), after one warm-up generate; then
llama-bench's `-p --prompt -n 0` and `-p 0 -n --gen` on the same threads. The CPU is named and
the 1-minute load average recorded beside every figure: a shared host moves both, read the
ratios. State memory per request (the recurrent layers' fp32 state, whatever the context) and
K/V bytes per token (the attention layers only) are reported from the model's shapes.

  python bench/hybrid_models.py                      # ~75M-parameter dense model
  python bench/hybrid_models.py --moe --runs 3
  python bench/hybrid_models.py --llama-bin ''       # MLXR alone
  python bench/hybrid_models.py --device cuda --llama-bin ~/llama.cpp/build/bin   # the GPU (-ngl 99)
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import time
from pathlib import Path

import torch

import bench_folders  # noqa: F401,I001  (bench/peers on sys.path)
from common import cpu_model, device_name, median, print_table, write_result

LLAMA_BIN = "/work/lcpp/llama.cpp/build-cpu/bin"


def load() -> float:
    return round(os.getloadavg()[0], 2)


def config(a: argparse.Namespace) -> dict:
    kinds = ["linear_attention"] * 3 + ["full_attention"]
    cfg = {"vocab_size": 4096, "hidden_size": a.hidden, "intermediate_size": 3 * a.hidden, "num_hidden_layers": a.layers,
           "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256, "rms_norm_eps": 1e-6,
           "max_position_embeddings": 8192, "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 2,
           "layer_types": (kinds * a.layers)[: a.layers], "linear_num_key_heads": 8, "linear_num_value_heads": 16,
           "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
           "rope_parameters": {"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25}}
    if a.moe:
        return {**cfg, "model_type": "qwen3_5_moe_text", "architectures": ["Qwen3_5MoeForCausalLM"], "num_experts": 16,
                "num_experts_per_tok": 4, "moe_intermediate_size": a.hidden // 2,
                "shared_expert_intermediate_size": a.hidden}
    return {**cfg, "model_type": "qwen3_5_text", "architectures": ["Qwen3_5ForCausalLM"]}


def gguf_file(a: argparse.Namespace) -> Path:
    from mlxr.testing.arch_fixtures import ArchFixture, arch_fixture_dir
    from mlxr.testing.llama_cpp_convert import llama_cpp_gguf

    name = f"bench-qwen35{'moe' if a.moe else ''}-{a.hidden}x{a.layers}"
    hf_dir = arch_fixture_dir(name, Path(a.work), ArchFixture(config(a), seed=1, gemma_norms=True))
    return llama_cpp_gguf(hf_dir, Path(a.work), "f32", ("--no-mtp",))


def llama_bench(a: argparse.Namespace, path: Path, args: list[str]) -> float:
    argv = [str(Path(a.llama_bin) / "llama-bench"), "-m", str(path), "-t", str(a.threads), "-r", "1",
            "-ngl", "99" if a.device == "cuda" else "0",
            "-o", "json", *args]
    run = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=3600)
    return float(json.loads(run.stdout)[0]["avg_ts"])


def timed(llm, prompts: list[list[int]], max_tokens: int) -> float:
    from mlxr import SamplingParams

    start = time.perf_counter()
    llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    return time.perf_counter() - start


def mlxr_run(a: argparse.Namespace, llm, rng: random.Random) -> dict:
    def ids(n):
        return [rng.randrange(3, 4000) for _ in range(n)]

    prefill_s = timed(llm, [ids(a.prompt)], 1)
    # Decode from a short prompt (as llama-bench's -p 0 -n), less the time of that prompt's first
    # token: after a long prompt the decode would be the difference of two long, noisy prefills.
    first_one = timed(llm, [ids(16)], 1)
    one = timed(llm, [ids(16)], 1 + a.gen)
    first = timed(llm, [ids(16) for _ in range(a.batch)], 1)
    many = timed(llm, [ids(16) for _ in range(a.batch)], 1 + a.gen)
    return {"prefill_tok_s": a.prompt / prefill_s, "decode_b1_tok_s": a.gen / max(1e-9, one - first_one),
            f"decode_b{a.batch}_tok_s": a.batch * a.gen / max(1e-9, many - first)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--moe", action="store_true")
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--gen", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--llama-bin", default=LLAMA_BIN, help="llama.cpp's bin folder (llama-bench); empty: MLXR alone")
    p.add_argument("--work", default=str(Path(__file__).resolve().parents[1] / ".fixtures" / "bench"))
    a = p.parse_args()
    from mlxr import LLM

    path = gguf_file(a)
    torch.set_num_threads(a.threads)
    llm = LLM(str(path), dtype=torch.float32, device=a.device, max_num_seqs=max(8, a.batch), warm_up=False)
    args = llm.engine.core.core.parts.args
    kv = llm.engine.core.core.kv
    rng, rows = random.Random(0), []
    timed(llm, [list(range(3, 3 + a.prompt))], 2)  # warm-up (llama-bench warms up too): kernel builds, first allocations
    for run in range(a.runs):  # interleaved: both see the same load on a shared host
        rows.append({"engine": "mlxr", "run": run, "load": load(), **mlxr_run(a, llm, rng)})
        if a.llama_bin:
            rows.append({"engine": "llama.cpp", "run": run, "load": load(),
                         "prefill_tok_s": llama_bench(a, path, ["-p", str(a.prompt), "-n", "0"]),
                         "decode_b1_tok_s": llama_bench(a, path, ["-p", "0", "-n", str(a.gen)])})
    columns = ["engine", "run", "load", "prefill_tok_s", "decode_b1_tok_s", f"decode_b{a.batch}_tok_s"]
    summary = {}
    for engine in ("mlxr", "llama.cpp"):
        mine = [r for r in rows if r["engine"] == engine]
        if mine:
            summary[engine] = {c: median([r[c] for r in mine if c in r]) for c in columns[3:] if c in mine[0]}
    if "llama.cpp" in summary:
        summary["ratio_mlxr_over_llama_cpp"] = {c: summary["mlxr"][c] / summary["llama.cpp"][c]
                                                for c in summary["llama.cpp"]}
    memory = {"state_bytes_per_request": args.linear_attention.state_bytes_per_sequence(),
              "kv_bytes_per_token": kv.blocks[0, 0, 0].numel() * 2 * len(kv.layers) // kv.block_size
              * kv.blocks.element_size(),
              "params": sum(p.numel() for p in llm.engine.core.core.parts.model.parameters())}
    print(f"{device_name(a.device)}, {a.threads} threads; {path.name} ({memory['params'] / 1e6:.0f}M parameters); "
          f"state {memory['state_bytes_per_request'] / 2**20:.2f} MiB a request, "
          f"K/V {memory['kv_bytes_per_token'] / 1024:.1f} KiB a token")
    print_table(rows, columns)
    print(json.dumps(summary, indent=1))
    out = write_result("hybrid_models", {"cpu": cpu_model(), "device": device_name(a.device), "threads": a.threads, "shared_host_load_1m": load(),
                                         "args": vars(a), "gguf": str(path), "memory": memory, "rows": rows,
                                         "summary": summary})
    print(out)


if __name__ == "__main__":
    main()
