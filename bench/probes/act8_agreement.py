"""Would 8-bit activations keep prefill's agreement? Teacher-forced top-1 agreement with the
file dequantized to fp32 (as tests/test_quant_models.py, but every position by prefill), with
the activations of some matrices rounded to 8 bits per 32 columns first (one int8 per value
and an fp32 unit, as llama.cpp's Q8_0 activations), which quant.c's 16-bit kernel then carries
exactly. JSON to bench/results/<day>/act8_agreement-*.json.

  python bench/probes/act8_agreement.py --model gemma3-270m [--modes none all gate_up not_down]

Modes: none (quant.c as it is), all, gate_up (the MLP's fused gate/up only: n > 2k), not_down
(all but matrices that narrow: n >= k), outlier5 (8 bits in the 256-column groups where no
row's 32-block has absmax > 5x its rms).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common, quant_cpu)
from common import cpu_model, print_table, write_result
from quant_cpu import model_file

import mlxr.ops.quant.quant as quant_dispatch
from mlxr.llm import LLM
from mlxr.types import SamplingParams

N_TOKENS = 512


def round8(x: torch.Tensor, k: int) -> torch.Tensor:
    """x [rows, k] rounded to int8 per 32 columns (unit absmax / 127), back in fp32."""
    b = x.reshape(-1, k // 32, 32)
    unit = b.abs().amax(-1, keepdim=True) / 127
    return (torch.round(b / torch.where(unit > 0, unit, 1)) * unit).reshape(x.shape)


def outlier_free_groups(x: torch.Tensor, k: int, limit: float) -> torch.Tensor:
    """[k/32] bool: the 32-blocks whose 256-column group has no block with absmax > limit * rms."""
    b = x.reshape(-1, k // 32, 32)
    ratio = (b.abs().amax(-1) / b.pow(2).mean(-1).sqrt().clamp_min(1e-30)).amax(0)
    groups = -(-k // 256)
    padded = torch.zeros(groups * 8)
    padded[: k // 32] = ratio
    return (padded.view(groups, 8).amax(-1) <= limit).repeat_interleave(8)[: k // 32]


def rounding(mode: str, x: torch.Tensor, n: int, k: int) -> torch.Tensor:
    if mode == "outlier5":
        keep = outlier_free_groups(x, k, 5.0)
        return torch.where(keep[None, :, None], round8(x, k).reshape(-1, k // 32, 32),
                           x.reshape(-1, k // 32, 32)).reshape(x.shape)
    picked = {"none": False, "all": True, "gate_up": n > 2 * k, "not_down": n >= k}[mode]
    return round8(x, k) if picked else x


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--modes", nargs="*", default=["none", "all", "gate_up", "not_down", "outlier5"])
    a = p.parse_args()
    kernel, state = quant_dispatch.quant_cpu.qmatmul_cpu, {"mode": "none"}

    def rounded_first(x, raw, qtype, k, lib=None):
        rows = x.numel() // k
        if rows > 1 and k % 32 == 0:  # prefill rows only (decode keeps 16 bits in any mode)
            x = rounding(state["mode"], x.reshape(rows, k), raw.shape[0], k).reshape(x.shape)
        return kernel(x, raw, qtype, k, lib)

    quant_dispatch.quant_cpu.qmatmul_cpu = rounded_first
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    import paged_probe  # tests/paged_probe.py: the engine's own paged path, all positions at once

    path = model_file(a.model)
    quant = LLM(path, quantization="auto", max_num_seqs=1)
    ref = LLM(path, quantization="none", dtype="float32", max_num_seqs=1)
    prompt = quant.tokenizer.encode("Once upon a time, in a small village by the sea, there lived")
    text = quant.generate([prompt], SamplingParams(max_tokens=N_TOKENS - len(prompt), temperature=1.0, top_k=40,
                                                   seed=0, ignore_eos=True))[0].outputs[0].token_ids
    ids = (prompt + list(text))[:N_TOKENS]
    theirs = paged_probe.paged_logits(ref, ids, len(ids))[:-1].argmax(-1)
    rows = []
    for mode in a.modes:
        state["mode"] = mode
        ours = paged_probe.paged_logits(quant, ids, len(ids))[:-1].argmax(-1)
        rows.append({"mode": mode, "agreement": float((ours == theirs).float().mean()), "positions": len(ids) - 1})
    write_result("act8_agreement", {"cpu": cpu_model(), "model": a.model, "rows": rows})
    print_table(rows, ["mode", "agreement", "positions"])


if __name__ == "__main__":
    main()
