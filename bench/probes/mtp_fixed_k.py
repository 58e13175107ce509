"""Qwen3.5's MTP layer (trained as bench/spec_heads.py's qwen35-mtp row trains it) with the
speculator's adaptive draft length (one more after a fully kept draft, else one past what was
kept) against a fixed k: tokens per target forward and drafts kept per position, batch 1,
greedy. The probe behind docs/speculative-decoding.md's note that MLXR's gap to llama.cpp's
draft-mtp (fixed --spec-draft-n-max) on the same layer is the policy. JSON to
bench/results/<day>/mtp_fixed_k-*.json.

  python bench/probes/mtp_fixed_k.py [--steps 300] [--k 4] [--prompts 6] [--max-tokens 48]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.common import cpu_model, print_table, write_result  # noqa: E402
from mlxr import LLM, SamplingParams  # noqa: E402
from mlxr.engine.spec_decode import speculator  # noqa: E402
from mlxr.testing.hybrid_fixtures import hybrid_fixture_dir, write_scaled_mixer_target  # noqa: E402
from mlxr.testing.qwen35_mtp_training import train_qwen35_mtp  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / ".fixtures"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=48)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mlxr-mtp-fixed-k-"))
    target = write_scaled_mixer_target(hybrid_fixture_dir("tiny-qwen35", FIXTURES), work / "target", 0.05)
    head, _ = train_qwen35_mtp(target, work / "mtp", steps=a.steps, lr=1e-2)
    prompts = torch.randint(3, 512, (a.prompts, 8), generator=torch.Generator().manual_seed(7)).tolist()
    params = SamplingParams(max_tokens=a.max_tokens, temperature=0.0, ignore_eos=True)
    observe, rows = speculator.Speculator.observe, []
    for policy in ("adaptive", "fixed"):
        if policy == "fixed":  # every row drafts k again after each step (the patched core is this process's)
            def fixed(self, out, result):
                observe(self, out, result)
                self._k.clear()
            speculator.Speculator.observe = fixed
        spec = LLM(str(head), dtype="float32", speculative_method="mtp", speculative_model=str(head),
                   num_speculative_tokens=a.k, engine_process=False)
        tokens = sum(len(spec.generate([p], params)[0].outputs[0].token_ids) for p in prompts)
        st = spec.engine.core.core.speculator.stats
        rows.append({"policy": policy, "tokens_per_forward": round(tokens / (tokens - st.num_accepted_tokens), 2),
                     "acceptance": round(st.num_accepted_tokens / max(st.num_draft_tokens, 1), 3),
                     "kept_given_offered": [round(x / max(d, 1), 3) for x, d in
                                            zip(st.accepted_per_position, st.drafted_per_position)]})
    speculator.Speculator.observe = observe
    print_table(rows, ["policy", "tokens_per_forward", "acceptance", "kept_given_offered"])
    path = write_result("mtp_fixed_k", {"device": "cpu", "cpu": cpu_model(), "args": vars(a),
                                        "load_average": os.getloadavg(), "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
