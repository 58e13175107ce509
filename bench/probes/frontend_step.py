"""The frontend's host work per decode step at a large batch, with no model: a step's
CoreOutputs for N streamed requests encoded (the core's side), decoded and taken in by the
OutputProcessor (detokenize, stop strings, RequestOutputs), as LLMEngine.step does with the core
in its own process. Why: on an H200 the batch-256 decode measured at the frontend averaged 2.37
ms a step while the core's steps landed every 2.0 ms (median; p90 2.3): the frontend's own work
per step is one suspect (a device-only probe, printed). JSON to bench/results/frontend_step-*.json.

  python bench/probes/frontend_step.py [--batch 256] [--steps 128] [--model tinyllama-shape] [--profile] [--label L]
Found (this 2-vCPU Xeon, tinyllama-shape tokenizer, batch 256, medians of 5, two runs): 0.89-0.98 -> 0.84-0.90 ms a
step with no stop string, 1.34-1.45 -> 0.99-1.01 ms with one (frontend_step-*, labels before/after: the finished check as a
loop, the stop ids read once, stop strings searched only in text holding a stop's first character).
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import time

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common)
from common import median, write_result
from mlxr.engine.frontend.output_processor import OutputProcessor, RequestState
from mlxr.engine.records import CoreOutputs, EngineCoreOutput, decoder, encode
from mlxr.types import RequestMetrics, SamplingParams


def tokenizer_of(model: str):
    from mlxr.testing.fixtures import fixture_paths
    from mlxr.tokenizer.tokenizer import Tokenizer

    return Tokenizer.from_hf_dir(fixture_paths(model).hf_dir)


def run(tok, batch: int, steps: int, stop: list[str] | None, prof: cProfile.Profile | None) -> list[float]:
    rnd = random.Random(0)
    vocab = tok.vocab_size
    proc = OutputProcessor(tok)
    params = SamplingParams(max_tokens=steps, stop=stop)
    for i in range(batch):
        prompt = [rnd.randrange(10, vocab - 10) for _ in range(128)]
        proc.add(RequestState(f"r{i}", None, prompt, params, RequestMetrics(time.monotonic()), True), [f"r{i}"])
    dec = decoder(CoreOutputs).decode
    times = []
    for s in range(steps):
        last = s == steps - 1
        outs = [EngineCoreOutput(f"r{i}", [rnd.randrange(10, vocab - 10)], finish_reason="length" if last else None)
                for i in range(batch)]
        wire = encode(CoreOutputs(outs, None))
        if prof:
            prof.enable()
        t0 = time.perf_counter()
        proc.process(dec(wire).outputs)
        times.append(time.perf_counter() - t0)
        if prof:
            prof.disable()
    return times


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--model", default="tinyllama-shape")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--label", default="", help="what tree this is (the JSON's commit is HEAD's)")
    a = p.parse_args()
    tok = tokenizer_of(a.model)
    rows = []
    for stop in (None, ["\n\n"]):
        meds = [1e3 * median(run(tok, a.batch, a.steps, stop, None)) for _ in range(a.rounds)]
        rows.append({"stop": stop, "step_ms_median_per_round": meds, "step_ms": median(meds)})
        print(f"batch {a.batch}, stop {stop}: frontend {median(meds):.3f} ms a step (rounds {' '.join(f'{m:.3f}' for m in meds)})")
    if a.profile:
        prof = cProfile.Profile()
        run(tok, a.batch, a.steps, None, prof)
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    write_result("frontend_step", {"label": a.label, "model": a.model, "batch": a.batch, "steps": a.steps, "rows": rows})


if __name__ == "__main__":
    main()
