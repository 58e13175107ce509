"""The same CPU benches on two commits of MLXR, interleaved on one machine: is this tree slower
than an older one? Each tree runs its own bench scripts (bench/latency.py, bench/throughput.py,
bench/serve.py) in a subprocess with PYTHONPATH at that tree, rounds alternate which tree goes
first, and the medians of every figure are compared (ratio = new / old, higher is better).

  python bench/old_vs_new.py --old bca21d8 [--rounds 3] [--model gemma3-270m]

The old tree is checked out as a detached git worktree under /tmp (made once, then reused).
Writes bench/results/old_vs_new-<stamp>.json."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import cpu_model, median, print_table, write_result

ROOT = Path(__file__).resolve().parents[1]

# (figure name, bench script arguments, how to read the figure from its JSON result)
FIGURES = [
    ("prefill_tok_s", ["latency.py", "--no-hf", "--runs", "3"], lambda d: d["results"][0]["prefill_tok_s"]),
    ("decode_tok_s", ["latency.py", "--no-hf", "--runs", "3"], lambda d: d["results"][0]["decode_tok_s"]),
    ("batch8_gen_tok_s", ["throughput.py", "--no-hf", "--batch", "8"], lambda d: d["results"][0]["gen_tok_s"]),
    ("serve8_out_tok_s", ["serve.py", "--num-requests", "8", "--rates", "inf", "--gen-len", "32"],
     lambda d: d["results"][0]["out_tok_s"]),
]


def old_tree(commit: str) -> Path:
    path = Path(tempfile.gettempdir()) / f"mlxr-old-{commit}"
    if not path.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), commit], check=True)
    return path


def run_bench(tree: Path, script_args: list[str], model: str) -> dict:
    """One bench script of `tree` on `model`; its JSON result (an older tree's scripts ignore
    MLXR_BENCH_RESULTS and write under their own bench/results)."""
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "PYTHONPATH": str(tree), "MLXR_BENCH_RESULTS": out}
        cmd = [sys.executable, script_args[0], "--model", model, *script_args[1:]]
        started = time.time()
        subprocess.run(cmd, cwd=tree / "bench", env=env, check=True, stdout=subprocess.DEVNULL)
        prefix = script_args[0].removesuffix(".py")
        found = list(Path(out).glob("*.json")) or [
            p for p in (tree / "bench" / "results").rglob(f"{prefix}-*.json") if p.stat().st_mtime >= started]
        return json.loads(max(found, key=lambda p: p.stat().st_mtime).read_text())


def one_round(trees: dict[str, Path], order: list[str], model: str) -> dict[str, dict[str, float]]:
    figures: dict[str, dict[str, float]] = {name: {} for name in trees}
    scripts = {tuple(args): None for _, args, _ in FIGURES}
    for args in scripts:
        for name in order:
            data = run_bench(trees[name], list(args), model)
            for fig, fig_args, read in FIGURES:
                if tuple(fig_args) == args:
                    figures[name][fig] = read(data)
    return figures


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--old", required=True, help="the older commit")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", default="gemma3-270m")
    a = p.parse_args()
    trees = {"old": old_tree(a.old), "new": ROOT}
    rounds = []
    for r in range(a.rounds):
        rounds.append(one_round(trees, ["old", "new"] if r % 2 == 0 else ["new", "old"], a.model))
        print(f"round {r + 1}: {rounds[-1]}", file=sys.stderr, flush=True)
    rows = []
    for fig, _, _ in FIGURES:
        old, new = (median([rd[t][fig] for rd in rounds]) for t in ("old", "new"))
        rows.append({"figure": fig, "old": old, "new": new, "ratio": new / old})
    print_table(rows, ["figure", "old", "new", "ratio"])
    print(write_result("old_vs_new", {"cpu": cpu_model(), "cpus": os.cpu_count(), "model": a.model, "old": a.old,
                                      "rounds": rounds, "rows": rows}))


if __name__ == "__main__":
    main()
