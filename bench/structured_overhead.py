"""Structured-output overhead: decode tok/s with a JSON schema on every request against the same
requests unconstrained, interleaved (plain, schema, plain, schema, ...), single stream and a
batch: the median ratio and each rep's pair ratio (its arms ran back to back); the host's mask
time per constrained token (in all and per way of filling), and each arm's host time per engine
step by phase (step_phases.py). Writes
bench/results/<day>/structured_overhead-*.json.

The schema never completes within --gen-len tokens (an array with many required items), so both
arms generate exactly gen-len tokens per request (the plain arm ignores EOS).

  python bench/structured_overhead.py --device cpu --batches 1 --reps 5
  python bench/structured_overhead.py --device cpu --overlap --model .fixtures/tinyllama-vocab-f32-v2/hf --batches 64
  python bench/structured_overhead.py --device cuda --model gemma3-270m --batches 1 64 --reps 5
  python bench/structured_overhead.py --device cuda --batches 1 64 --reps 3      # issue 48's 3 pairs (SmolLM2)
  MLXR_JUMP_FORWARD=0 python bench/structured_overhead.py ...   # the masks' cost alone, no forced drafts
"""
from __future__ import annotations

import argparse
import dataclasses
import platform
import time

import torch

from common import device_name, median, print_table, write_result
from step_phases import PHASES, host_facts, per_step, time_phases
from mlxr import LLM, SamplingParams
from mlxr.types import StructuredOutputsParams

SCHEMA = {"type": "object", "properties": {"rows": {"type": "array", "minItems": 10_000, "items": {
    "type": "object", "additionalProperties": False, "required": ["id", "name", "ok"],
    "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 100000},
                   "name": {"type": "string", "maxLength": 12}, "ok": {"type": "boolean"}}}}},
          "required": ["rows"], "additionalProperties": False}


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def eager(step_ms: dict) -> int:
    """Forwards that replayed no decode graph (prefill and mixed steps, and steps past the graphs' sizes)."""
    calls = step_ms["calls"]
    return calls["forward"] - calls["forward_graph"]


def run_arm(llm: LLM, batch: int, gen_len: int, constrained: bool) -> tuple[float, int]:
    spec = StructuredOutputsParams(json=SCHEMA) if constrained else None
    params = SamplingParams(max_tokens=gen_len, temperature=0.8, seed=1, ignore_eos=not constrained,
                            structured_outputs=spec)
    prompts = [f"Write record list number {i} as JSON:" for i in range(batch)]
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    assert all(o.outputs[0].finish_reason == "length" for o in outs), "an arm ended early"
    return tokens / elapsed, tokens


def _draft_stats(llm: LLM) -> dict | None:
    """What the rows drafted in the whole run (jump-forward's forced tokens; the plain arm drafts none)."""
    spec = llm.engine.core.core.speculator
    return None if spec is None else dataclasses.asdict(spec.stats)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--gen-len", type=int, default=96)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=None,
                    help="overlapped steps (default: on CUDA only); --overlap on a CPU runs the GPU's step order")
    ap.add_argument("--label", default="", help="recorded in the JSON (e.g. which tree ran, for before/after pairs)")
    a = ap.parse_args()
    llm = LLM(a.model, device=a.device, engine_process=False, max_num_seqs=max(64, *a.batches),
              overlap_steps=a.overlap)
    manager = llm.engine.core.core.structured
    rows = []
    for batch in a.batches:
        run_arm(llm, batch, a.gen_len, False), run_arm(llm, batch, a.gen_len, True)  # warm-up, grammar compile
        plain, schema, spent = [], [], {False: {}, True: {}}
        before = manager.timing.snapshot()
        for _ in range(a.reps):
            for constrained, runs in ((False, plain), (True, schema)):
                with time_phases(llm, spent[constrained]):
                    runs.append(run_arm(llm, batch, a.gen_len, constrained)[0])
        fill = manager.timing.since(before)
        pairs = [s / p for p, s in zip(plain, schema)]  # each rep's arms ran back to back: the same load
        rows.append({"batch": batch, "plain_tok_s": median(plain), "schema_tok_s": median(schema),
                     "ratio": median(schema) / median(plain), "pair_ratios": pairs, "min_pair_ratio": min(pairs),
                     "mask_us_per_token": fill["us_per_row"],
                     "mask_fill": fill, "mask_fill_choice_us_per_row": manager.filler.us_per_row,
                     "mask_where_us_per_row": getattr(manager, "where_us_per_row", None),  # None: a tree before it
                     "plain_step_ms": per_step(spent[False]), "schema_step_ms": per_step(spent[True]),
                     "plain_runs": plain, "schema_runs": schema})
        print(f"batch {batch}: plain {median(plain):.1f} tok/s, schema {median(schema):.1f} tok/s, "
              f"pairs {' '.join(f'{x:.2f}' for x in pairs)}, mask {fill['us_per_row']:.1f} us/row {fill['by_kind']}",
              flush=True)
    print_table(rows, ["batch", "plain_tok_s", "schema_tok_s", "ratio", "min_pair_ratio", "mask_us_per_token"])
    print_table([{"arm": f"b{r['batch']} {arm}", **r[f"{arm}_step_ms"], "eager": eager(r[f"{arm}_step_ms"])}
                 for r in rows for arm in ("plain", "schema")], ["arm", "steps", "eager", "step", *PHASES, "rest"])
    path = write_result("structured_overhead", {
        "label": a.label, "model": a.model, "device": device_name(a.device), "cpu": cpu_model(), "gen_len": a.gen_len,
        "overlap": llm.engine.core.core.overlap, "jump_forward": llm.engine.core.core.config.jump_forward,
        "drafts": _draft_stats(llm),
        "reps": a.reps, "grammar_engine": "llguidance", "threads": torch.get_num_threads(), **host_facts(),
        "step_ms_note": "host ms per engine step; on CUDA, forward and sample are enqueue times and "
                        "wait is the host blocked on the device", "rows": rows})
    print(path)


if __name__ == "__main__":
    main()
