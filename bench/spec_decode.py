"""Speculative decoding's speedup, as a ratio to the same engine with speculation off, run
interleaved (the "off" runs are the same engine's requests with SamplingParams.speculative=False).

1. n-gram (prompt lookup) on input-grounded work with the instruct model smollm2:135m: rewrite
   or edit a given text or code (the answer repeats much of the input); batch 1 and batch 64.
2. a draft model with controlled acceptance: the target is the draft plus Gaussian noise of a few
   scales on its weights; speedup against the measured acceptance rate.

3. with --json: n-gram at batch 1 on JSON edits under a JSON-object grammar and under the
   document's schema (each drafted position under its own mask; the schema's keys are drafted
   as forced text): the answers must be the same and JSON either way.

    python bench/spec_decode.py --device cpu|cuda [--rounds 3] [--max-tokens 128] [--skip-draft] [--batches 1 64] [--json]
Writes bench/results/spec_decode-<stamp>.json. Beside llama.cpp's own speculation on the same
file and tasks (the n-gram part at batch 1, all engines interleaved in one run):
bench/peers/llama_spec.py --mlxr cpu|cuda with --python and/or --server-bin."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import cpu_model, device_name, print_table, write_result  # noqa: E402
from bench.spec_tasks import TASK_CLASS, TASK_CLASSES, TASKS, chat_ids  # noqa: E402
from mlxr.config import SuffixConfig  # noqa: E402
from mlxr import LLM, SamplingParams  # noqa: E402
from mlxr.bundled_models import smollm2_135m_path  # noqa: E402
from mlxr.types import StructuredOutputsParams  # noqa: E402

DOC = ('{"name": "Ada Lovelace", "born": 1815, "city": "London", "languages": ["English", "French"], '
       '"fields": ["mathematics", "computing"], "note": "wrote the first published algorithm"}')
JSON_TASKS = [
    f'Return this JSON object with "city" set to "Paris"; keep every other field as it is.\n\n{DOC}',
    f'Return this JSON object with "born" renamed to "year"; keep everything else the same.\n\n{DOC}',
    "Describe a fictional scientist as a JSON object with the fields name, born, city, languages, fields "
    "and note.",  # nothing to copy: under the schema only its forced keys are drafted
]


IGNORE_EOS = False  # --ignore-eos: every request runs to max_tokens (fixed work, for A/Bs of trees whose
# rounding differs: at batch 64 the point where each request stops sets how long the small-batch tail runs)


def timed(llm: LLM, prompts: list[list[int]], max_tokens: int, speculative: bool,
          structured: StructuredOutputsParams | None = None) -> tuple[float, int, list]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, speculative=speculative, structured_outputs=structured,
                            ignore_eos=IGNORE_EOS)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    dt = time.perf_counter() - t0
    tokens = [o.outputs[0].token_ids for o in outs]
    return dt, sum(len(t) for t in tokens), tokens


def ab(llm: LLM, prompts: list[list[int]], max_tokens: int, rounds: int,
       structured: StructuredOutputsParams | None = None) -> dict:
    """Interleaved off/on rounds: tokens/s of each, acceptance, and whether outputs matched."""
    return ab_methods({"on": llm}, prompts, max_tokens, rounds, structured)["on"]


def ab_methods(llms: dict[str, LLM], prompts: list[list[int]], max_tokens: int, rounds: int,
               structured: StructuredOutputsParams | None = None) -> dict[str, dict]:
    """Per method (an engine each): off/on pairs, every round running every method's pair back to
    back; tokens/s medians, each round's on/off ratio, acceptance, whether outputs matched off's."""
    rates = {m: {True: [], False: []} for m in llms}
    same = dict.fromkeys(llms, True)
    before = {m: llm.engine.stats() for m, llm in llms.items()}
    for _ in range(rounds):
        for m, llm in llms.items():
            for spec in (False, True):
                dt, n, toks = timed(llm, prompts, max_tokens, spec, structured)
                rates[m][spec].append(n / dt)
                if spec:
                    same[m] &= toks == ref
                else:
                    ref = toks
    out = {}
    for m, llm in llms.items():
        after = llm.engine.stats()
        drafted = after.spec_num_draft_tokens - before[m].spec_num_draft_tokens
        accepted = after.spec_num_accepted_tokens - before[m].spec_num_accepted_tokens
        off_all, on_all = rates[m][False], rates[m][True]
        off, on = sorted(off_all)[len(off_all) // 2], sorted(on_all)[len(on_all) // 2]
        out[m] = {"off_tok_s": off, "on_tok_s": on, "speedup": on / off,
                  "paired_speedup": sorted(b / a for a, b in zip(off_all, on_all))[len(on_all) // 2],
                  "acceptance": accepted / drafted if drafted else 0.0, "draft_tokens": drafted,
                  "outputs_identical": same[m], "off_all": off_all, "on_all": on_all, "tokens_per_round": n}
    return out


def make_llms(args, model: str) -> dict[str, LLM]:
    """One engine per method. "suffix": the request's own tree only (the rounds repeat the same
    requests, and a shared tree of their earlier outputs would draft each answer whole);
    "suffix-shared": with the shared tree of finished outputs (an upper bound here, for that reason)."""
    llms = {}
    for m in args.methods:
        extra = {"suffix": SuffixConfig(cache_responses=0)} if m == "suffix" else {}
        llms[m] = LLM(model, device=args.device, speculative_method=m.split("-")[0], num_speculative_tokens=args.k,
                      max_num_seqs=64, speculative_max_batch=args.spec_max_batch, **extra)
    return llms


def lookup_part(args, model: str) -> list[dict]:
    """Model-free proposers (n-gram, suffix) on the grounded tasks: batch 1 per task (and per
    task class), larger batches over all the tasks mixed."""
    rows = []
    llms = make_llms(args, model)
    ids = [chat_ids(next(iter(llms.values())).tokenizer, messages) for messages in TASKS]
    for llm in llms.values():
        timed(llm, ids[:1], 8, True)  # warm
    for batch in args.batches:
        prompts = [ids[i % len(ids)] for i in range(batch)] if batch > 1 else None
        if prompts:  # the first batch of this size carries one-off costs; neither side of the A/B takes them
            for llm in llms.values():
                timed(llm, prompts, args.batch_max_tokens, False)
        results = []
        for task in (range(len(ids)) if batch == 1 else [None]):
            p = [ids[task]] if batch == 1 else prompts
            results.append(ab_methods(llms, p, args.max_tokens if batch == 1 else args.batch_max_tokens, args.rounds))
        for m in llms:
            rows.append(_lookup_row(m, batch, [r[m] for r in results], args.k))
        print_table(rows[-len(llms):], ["part", "batch", "off_tok_s", "on_tok_s", "speedup", "paired_speedup",
                                        "acceptance", "outputs_identical", *TASK_CLASSES])
    for llm in llms.values():
        llm.shutdown()
    return rows


def _lookup_row(method: str, batch: int, results: list[dict], k: int) -> dict:
    mean = lambda key, rs=results: sum(r[key] for r in rs) / len(rs)  # noqa: E731
    row = {"part": method, "batch": batch, "k": k, "off_tok_s": mean("off_tok_s"), "on_tok_s": mean("on_tok_s"),
           "acceptance": mean("acceptance"), "paired_speedup": mean("paired_speedup"),
           "outputs_identical": all(r["outputs_identical"] for r in results), "per_task": results}
    row["speedup"] = row["on_tok_s"] / row["off_tok_s"]
    if batch == 1:  # each class's mean of its tasks' paired speedups
        for cls in TASK_CLASSES:
            row[cls] = mean("paired_speedup", [r for c, r in zip(TASK_CLASS, results) if c == cls])
    return row


DOC_SCHEMA = {"type": "object", "additionalProperties": False,
              "required": ["name", "born", "city", "languages", "fields", "note"],
              "properties": {"name": {"type": "string"}, "born": {"type": "integer"}, "city": {"type": "string"},
                             "languages": {"type": "array", "items": {"type": "string"}},
                             "fields": {"type": "array", "items": {"type": "string"}}, "note": {"type": "string"}}}


def json_part(args, model: str) -> list[dict]:
    """n-gram at batch 1 on JSON edits under a JSON-object grammar (the answer repeats the input)
    and under the document's schema (its keys are forced text, drafted as such)."""
    llm = LLM(model, device=args.device, speculative_method="ngram", num_speculative_tokens=args.k)
    ids = [chat_ids(llm.tokenizer, t) for t in JSON_TASKS]
    rows = []
    for name, grammar in (("json_object", StructuredOutputsParams(json_object=True)),
                          ("schema", StructuredOutputsParams(json=DOC_SCHEMA))):
        timed(llm, ids[:1], 8, True, grammar)  # warm (and the grammar compiled)
        rows.append(_json_row(llm, ids, grammar, name, args))
    llm.shutdown()
    return rows


def _json_row(llm: LLM, ids: list[list[int]], grammar: StructuredOutputsParams, name: str, args) -> dict:
    results = []
    for p in ids:
        r = ab(llm, [p], args.max_tokens, args.rounds, grammar)
        _, _, toks = timed(llm, [p], args.max_tokens, True, grammar)
        r["finished"] = len(toks[0]) < args.max_tokens  # else cut by max_tokens: not whole JSON
        r["valid_json"] = _is_json(llm.tokenizer.decode(toks[0])) if r["finished"] else None
        results.append(r)
    row = {"part": f"ngram+{name}", "batch": 1, "k": args.k,
           "off_tok_s": sum(r["off_tok_s"] for r in results) / len(results),
           "on_tok_s": sum(r["on_tok_s"] for r in results) / len(results),
           "acceptance": sum(r["acceptance"] for r in results) / len(results),
           "outputs_identical": all(r["outputs_identical"] for r in results),
           "valid_json": all(r["valid_json"] is not False for r in results),  # of the finished answers
           "finished": sum(r["finished"] for r in results), "per_task": results}
    row["speedup"] = row["on_tok_s"] / row["off_tok_s"]
    print_table([row], ["part", "batch", "off_tok_s", "on_tok_s", "speedup", "acceptance", "outputs_identical",
                        "finished", "valid_json"])
    return row


def _is_json(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


@torch.inference_mode()
def add_noise(model: torch.nn.Module, scale: float, seed: int) -> None:
    """w += scale * std(w) * N(0, 1) on every floating weight matrix (the target = draft + noise)."""
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        if p.dim() == 2 and p.is_floating_point():
            noise = torch.randn(p.shape, generator=g).to(p.device, p.dtype)
            p.add_(noise * (scale * p.float().std().item()))


def draft_part(args, model: str) -> list[dict]:
    rows = []
    ids = None
    for scale in args.noise:
        # Noise needs float weights: dequantized, and fp32 on the CPU (its fp16 products are slow).
        llm = LLM(model, device=args.device, quantization="none", speculative_method="draft",
                  dtype="float32" if args.device == "cpu" else None,
                  num_speculative_tokens=args.k, speculative_draft_model=model, engine_process=False)
        add_noise(llm.engine.core.core.parts.model, scale, seed=0)
        ids = ids or [chat_ids(llm.tokenizer, messages) for messages in TASKS]
        timed(llm, ids[:1], 8, True)
        r = ab(llm, ids[:2], args.draft_max_tokens, args.rounds)
        row = {"part": "draft", "batch": 1, "k": args.k, "noise": scale, **r}
        rows.append(row)
        print_table([row], ["part", "noise", "off_tok_s", "on_tok_s", "speedup", "acceptance", "outputs_identical"])
        llm.shutdown()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--batch-max-tokens", type=int, default=128, help="max_tokens of the batch-64 runs")
    ap.add_argument("--draft-max-tokens", type=int, default=128, help="max_tokens of the draft-model runs")
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64], help="the lookup part's batch sizes")
    ap.add_argument("--methods", nargs="+", default=["ngram", "suffix"], choices=["ngram", "suffix", "suffix-shared"],
                    help="model-free proposers to measure, an engine each (make_llms says what suffix-shared adds)")
    ap.add_argument("--spec-max-batch", type=int, default=8, help="the engines' speculative_max_batch")
    ap.add_argument("--noise", type=float, nargs="+", default=[0.0, 0.1, 0.2, 0.4, 0.8])
    ap.add_argument("--skip-draft", action="store_true")
    ap.add_argument("--skip-lookup", "--skip-ngram", action="store_true", help="skip the n-gram / suffix part")
    ap.add_argument("--json", action="store_true", help="also n-gram under a JSON-object grammar (batch 1)")
    ap.add_argument("--ignore-eos", action="store_true", help="every request runs to its max_tokens")
    args = ap.parse_args()
    global IGNORE_EOS
    IGNORE_EOS = args.ignore_eos
    model = str(smollm2_135m_path())
    rows = [] if args.skip_lookup else lookup_part(args, model)
    if args.json:
        rows += json_part(args, model)
    if not args.skip_draft:
        rows += draft_part(args, model)
    path = write_result("spec_decode", {"device": device_name(args.device), "cpu": cpu_model(),
                                        "load1": os.getloadavg()[0], "model": "smollm2:135m (Q4_1 GGUF)",
                                        "args": vars(args), "rows": rows,
                                        "note": "off = the same engine's requests with speculative=False, interleaved"})
    print(path)


if __name__ == "__main__":
    main()
