"""Heads trained to copy their target (mlxr/testing/head_training.py, a few hundred CPU steps):
their drafts are kept, greedy output stays the plain engine's, and sampled output is
distributed exactly as without drafts (the chi-square test of test_spec_lossless.py)."""
from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from model_fixtures import FIXTURES, cached_llm, fixture_model
from test_spec_decode import generate, looping_requests
from test_spec_lossless import TOP_K, chi_square_p, exact_distribution
from mlxr import LLM, SamplingParams
from mlxr.testing.head_fixtures import write_scaled_attention_target
from mlxr.testing.head_training import train_head

HEADS = FIXTURES / "heads-v2"  # (v2: trained for two drafts)
SCALE = 0.05
SAMPLES = 8_000


def _written_once(path: Path, write) -> Path:
    """write(tmp) fills a private directory, renamed into place (safe across processes)."""
    if not path.is_dir():
        HEADS.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=HEADS, prefix=f".tmp-{os.getpid()}-"))
        write(tmp)
        try:
            tmp.rename(path)
        except OSError:  # another process wrote it first
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def scaled_target() -> Path:
    return _written_once(HEADS / f"scaled-target-{SCALE}",
                         lambda d: write_scaled_attention_target(fixture_model("tiny-llama").hf_dir, d, SCALE))


def trained(kind: str) -> tuple[str, str]:
    """(the model to load, the speculative_model) of a head trained to copy scaled_target()."""
    target = scaled_target()
    head = _written_once(HEADS / f"trained-{kind}-{SCALE}", lambda d: train_head(kind, target, d, lr=1e-2))
    return (str(head) if kind == "mtp" else str(target)), str(head)


@pytest.mark.slow
@pytest.mark.parametrize("kind,first_kept", [("eagle3", 0.5), ("mtp", 0.5)])
def test_a_trained_head_drafts_what_the_target_writes(kind, first_kept):
    model, head = trained(kind)
    reqs = looping_requests(8, seed=13)
    want = generate(cached_llm(str(scaled_target())), reqs)
    spec = LLM(model, dtype="float32", speculative_method=kind, speculative_model=head, num_speculative_tokens=3)
    before = spec.engine.stats()
    assert generate(spec, reqs) == want
    s = spec.engine.stats()
    drafts = s.spec_num_drafts - before.spec_num_drafts
    kept_first = s.spec_accepted_per_position[0] - before.spec_accepted_per_position[0]
    assert kept_first > first_kept * drafts, (kept_first, drafts)  # a random head keeps ~1 in 500


@pytest.mark.slow
def test_sampling_with_a_trained_mtp_head_is_distributed_as_plain():
    """8,000 draws of the first three tokens (top_k=4 at temperature 1: 64 outcomes) against the
    plain engine's exact probabilities, with drafts both kept and rejected."""
    model, head = trained("mtp")
    plain = cached_llm(model)
    prompt = [17, 240, 5, 388, 61, 402, 9, 133, 77, 301, 12, 450]  # (the head's drafts are kept on any prompt)
    probs = exact_distribution(plain, prompt)
    params = SamplingParams(max_tokens=3, temperature=1.0, top_k=TOP_K, ignore_eos=True)
    spec = LLM(model, dtype="float32", num_speculative_tokens=3, max_num_seqs=512, speculative_max_batch=1024,
               max_num_batched_tokens=8192, speculative_method="mtp", speculative_model=head)
    before = spec.engine.stats()
    counts: Counter = Counter()
    for _ in range(SAMPLES // 1000):
        for o in spec.generate([prompt] * 1000, params):
            counts[tuple(o.outputs[0].token_ids)] += 1
    s = spec.engine.stats()
    accepted = s.spec_num_accepted_tokens - before.spec_num_accepted_tokens
    drafted = s.spec_num_draft_tokens - before.spec_num_draft_tokens
    assert 0.2 * SAMPLES < accepted < drafted  # both kept and rejected drafts
    assert chi_square_p(counts, probs, SAMPLES) > 0.01
