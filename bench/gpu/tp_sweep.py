"""Tensor parallelism's figures: decode speed of one device against a tensor-parallel group on
the same random-weight shape, single stream and batch 64, interleaved run by run; and a model
too large for one device running on two.

Shapes: Llama-3-8B (bf16, ~16 GB) at TP=1 and TP=2; Llama-3-70B (bf16, ~141 GB: more than one
H200 holds) at TP=2 only. Weights are random, each rank drawing its own share on its device
(mlxr/distributed/model_shard.py), so no checkpoint is written or read. Each figure runs in a
fresh process (a group per run). `--device cpu --tiny` runs the same code on small shapes with
gloo (CI-sized); JSON to bench/results/tp_sweep-*.json.

  python bench/gpu/tp_sweep.py --device cuda               # 8B TP=1 vs TP=2, then 70B on TP=2
  python bench/gpu/tp_sweep.py --device cpu --tiny --runs 1
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_path  # noqa: E402,F401,I001  (bench/ on sys.path: common)
from common import device_name, median, print_table, write_result  # noqa: E402

from mlxr.model_config import ModelArgs  # noqa: E402

LLAMA3 = dict(model_type="llama", rope_theta=500000.0, max_position_embeddings=8192, rms_norm_eps=1e-5)
SHAPES = {
    "llama3-8b": ModelArgs(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                           num_attention_heads=32, num_key_value_heads=8, head_dim=128, **LLAMA3),
    "llama3-70b": ModelArgs(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                            num_attention_heads=64, num_key_value_heads=8, head_dim=128, **LLAMA3),
    "tiny": ModelArgs(vocab_size=2048, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=32, **LLAMA3),
    "tiny-big": ModelArgs(vocab_size=2048, hidden_size=512, intermediate_size=2048, num_hidden_layers=4,
                          num_attention_heads=8, num_key_value_heads=2, head_dim=64, **LLAMA3),
}


@dataclasses.dataclass(frozen=True)
class Case:
    shape: str
    tp: int
    batch: int
    prompt: int
    gen: int


def cases(tiny: bool, big: bool) -> list[Case]:
    shape, large = ("tiny", "tiny-big") if tiny else ("llama3-8b", "llama3-70b")
    prompt, gen1, gen64 = (16, 16, 8) if tiny else (128, 256, 128)
    out = [Case(shape, tp, b, prompt, g) for b, g in ((1, gen1), (64, gen64)) for tp in (1, 2)]
    if big:
        out += [Case(large, 2, 1, prompt, gen1), Case(large, 2, 64, prompt, gen64)]
    return out


# --- one case, in a process of its own ----------------------------------------------------------
def run_case(case: Case, device: str, eager: bool, tp_graphs: bool) -> dict:
    from mlxr.config import EngineConfig
    from mlxr.engine.core.core_parts import CoreParts
    from mlxr.engine.core.engine_core import EngineCore

    args, dtype = SHAPES[case.shape], torch.bfloat16 if device == "cuda" else torch.float32
    config = EngineConfig(max_num_seqs=max(case.batch, 1), kv_cache_memory_gb=4.0 if device == "cuda" else 0.25,
                          max_model_len=case.prompt + case.gen + 16, engine_process=False,
                          enable_cuda_graphs=not eager)
    if case.tp == 1:
        from mlxr.distributed.model_shard import random_model

        dev = torch.device(device)
        parts = CoreParts(random_model(args, dtype, dev), args, dtype, dev)
        core, stop = EngineCore(parts, config), lambda: None
    else:
        core, stop = _tp_core(args, dtype, device, case.tp, config, tp_graphs)
    try:
        return _decode_figures(core, case, device)
    finally:
        stop()


def _tp_core(args: ModelArgs, dtype: torch.dtype, device: str, tp: int, config, graphs: bool):
    import functools

    from mlxr.config import ParallelConfig
    from mlxr.distributed import messages as msg
    from mlxr.distributed.executor import TPExecutor, TPRunner
    from mlxr.distributed.model_shard import RANDOM_PREFIX, load_shard
    from mlxr.engine.core.core_parts import CoreParts
    from mlxr.engine.core.engine_core import EngineCore

    executor = TPExecutor(ParallelConfig(tp, cuda_graphs=graphs), device)
    spec = {"ref": RANDOM_PREFIX + msgspec.json.encode(args).decode(), "dtype": str(dtype).removeprefix("torch."),
            "weight_dtype": None, "device": device, "quantization": None}
    executor.send(msg.Load(spec))
    shard = load_shard(spec, executor.group)
    parts = CoreParts(shard.model, shard.local_args, shard.dtype, executor.group.device,
                      make_runner=functools.partial(TPRunner, executor=executor))
    return EngineCore(parts, config), executor.shutdown


def _decode_figures(core, case: Case, device: str) -> dict:
    from mlxr.engine.records import EngineCoreRequest
    from mlxr.types import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=case.gen, ignore_eos=True)
    gen = torch.Generator().manual_seed(case.batch)
    for i in range(case.batch):
        prompt = torch.randint(3, SHAPES[case.shape].vocab_size, (case.prompt,), generator=gen).tolist()
        core.add_request(EngineCoreRequest(f"r{i}", prompt, params, case.gen, [], 0.0))
    started: set[str] = set()
    t0 = time.perf_counter()
    while len(started) < case.batch:  # every prompt prefilled and its first token out
        started |= {o.request_id for o in core.step() if o.new_token_ids}
    t1, tokens = time.perf_counter(), 0
    while core.has_unfinished():
        tokens += sum(len(o.new_token_ids) for o in core.step())
    if device == "cuda":
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    return {"prefill_s": t1 - t0, "decode_tok_s": tokens / (t2 - t1), "decode_tokens": tokens}


# --- the sweep ------------------------------------------------------------------------------------
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="small shapes (CPU runs, CI)")
    p.add_argument("--runs", type=int, default=3, help="interleaved runs per case (the median is quoted)")
    p.add_argument("--no-big", action="store_true", help="skip the model too large for one device")
    p.add_argument("--eager", action="store_true",
                   help="no CUDA graphs at TP=1 either (tensor-parallel steps run eagerly: the like-for-like view)")
    p.add_argument("--tp-graphs", action="store_true",
                   help="capture CUDA graphs on every rank too, all-reduces inside (not yet run on GPUs)")
    p.add_argument("--case", help=argparse.SUPPRESS)  # internal: one case as JSON
    a = p.parse_args()
    if a.case:
        print(json.dumps(run_case(Case(**json.loads(a.case)), a.device, a.eager, a.tp_graphs)))
        return
    todo = cases(a.tiny, not a.no_big)
    runs: dict[Case, list[dict]] = {c: [] for c in todo}
    for _ in range(a.runs):
        for c in todo:
            runs[c].append(_run_in_process(c, a.device, a.eager, a.tp_graphs))
    rows = [{**dataclasses.asdict(c), "decode_tok_s": median([r["decode_tok_s"] for r in rs]),
             "runs": [r["decode_tok_s"] for r in rs]} for c, rs in runs.items()]
    for r in rows:
        base = next((b for b in rows if (b["shape"], b["batch"], b["tp"]) == (r["shape"], r["batch"], 1)), None)
        r["vs_tp1"] = r["decode_tok_s"] / base["decode_tok_s"] if base else None
    path = write_result("tp_sweep", {"device": device_name(a.device if a.device == "cpu" else "cuda:0"),
                                     "gpus": torch.cuda.device_count() if a.device == "cuda" else 0,
                                     "tiny": a.tiny, "eager": a.eager, "tp_graphs": a.tp_graphs, "rows": rows})
    print_table(rows, ["shape", "tp", "batch", "decode_tok_s", "vs_tp1"])
    print(f"wrote {path}")


def _run_in_process(c: Case, device: str, eager: bool, tp_graphs: bool) -> dict:
    flags = (["--eager"] if eager else []) + (["--tp-graphs"] if tp_graphs else [])
    done = subprocess.run([sys.executable, __file__, "--device", device, *flags, "--case", json.dumps(dataclasses.asdict(c))],
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{c} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
