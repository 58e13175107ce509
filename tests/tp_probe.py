"""Test helper: a model's figures through a real engine core: the float32 logits of a prefill
step of two prompts, and greedy generations with their top-5 logprobs. Run as a script,
`python tests/tp_probe.py --tp N --out DIR [--device cuda] REF...`, it is rank 0 of an N-rank
tensor-parallel group (mlxr.distributed: gloo on CPU, NCCL on GPUs) and probes each model in
turn on the same workers."""
from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from mlxr.config import EngineConfig, ParallelConfig
from mlxr.engine.core.core_parts import CoreParts
from mlxr.engine.core.engine_core import EngineCore
from mlxr.engine.records import EngineCoreRequest, NewRequestData, SchedulerOutput
from mlxr.types import SamplingParams

PROMPTS = [[1, 5, 9, 33, 70, 100, 7, 12, 19, 250, 31, 8, 64, 3, 77, 5, 200, 41], [1, 44, 3, 99]]
N_TOKENS = 10
CONFIG = EngineConfig(num_kv_blocks=64, max_num_seqs=4, warm_up=False, engine_process=False)


def probe(core: EngineCore) -> dict[str, torch.Tensor]:
    found = {"prefill_logits": _prefill_logits(core)}
    core.reset()
    params = SamplingParams(temperature=0.0, max_tokens=N_TOKENS, logprobs=5, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS):
        core.add_request(EngineCoreRequest(f"g{i}", prompt, params, N_TOKENS, [], 0.0))
    outputs = []
    while core.has_unfinished():
        outputs += core.step()
    for i in range(len(PROMPTS)):
        mine = [o for o in outputs if o.request_id == f"g{i}"]
        assert not any(o.error for o in mine), [o.error for o in mine]
        logprobs = [lp for o in mine for lp in o.new_logprobs or []]
        found[f"tokens_{i}"] = torch.tensor([t for o in mine for t in o.new_token_ids])
        found[f"top_ids_{i}"] = torch.tensor([[t for t, _ in lp.top] for lp in logprobs])
        found[f"top_logprobs_{i}"] = torch.tensor([[v for _, v in lp.top] for lp in logprobs])
    core.reset()
    return found


def _prefill_logits(core: EngineCore) -> torch.Tensor:
    bm = core.block_manager
    news = [NewRequestData(f"p{i}", p, len(p), SamplingParams(temperature=0.0), [], bm.take_blocks(bm.blocks_for(len(p))))
            for i, p in enumerate(PROMPTS)]
    out = SchedulerOutput(request_ids=[n.request_id for n in news], num_scheduled_tokens=[len(p) for p in PROMPTS],
                          num_computed_tokens=[0] * len(PROMPTS), new_requests=news)
    try:
        _, logits = core.runner.logits(out)
        return logits.clone()
    finally:
        for n in news:
            bm.release_blocks(n.block_ids)


def spec_of(ref: str, device: str) -> dict[str, str | None]:
    """REF is a path, or PATH@QUANTIZATION."""
    path, _, quantization = ref.partition("@")
    return {"ref": path, "dtype": "float32", "weight_dtype": None, "device": device, "quantization": quantization or None}


def main(argv: list[str]) -> int:
    from mlxr.distributed import messages as msg
    from mlxr.distributed.executor import TPExecutor, TPRunner
    from mlxr.distributed.model_shard import load_shard

    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, a GPU a rank)")
    p.add_argument("refs", nargs="+")
    ns = p.parse_args(argv)
    if ns.tp == 1:  # the single-device path, untouched
        from mlxr.loader import load_model

        for i, ref in enumerate(ns.refs):
            spec = spec_of(ref, ns.device)
            lm = load_model(spec["ref"], dtype=torch.float32, device=ns.device, quantization=spec["quantization"])
            save_file(probe(EngineCore(CoreParts(lm.model, lm.args, lm.dtype, lm.device), CONFIG)),
                      str(ns.out / f"{i}.safetensors"))
        return 0
    executor = TPExecutor(ParallelConfig(ns.tp), ns.device)
    try:
        for i, ref in enumerate(ns.refs):
            spec = spec_of(ref, ns.device)
            executor.send(msg.Load(spec))
            shard = load_shard(spec, executor.group)
            parts = CoreParts(shard.model, shard.local_args, shard.dtype, executor.group.device,
                              make_runner=functools.partial(TPRunner, executor=executor))
            save_file(probe(EngineCore(parts, CONFIG)), str(ns.out / f"{i}.safetensors"))
    finally:
        executor.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
