"""Model-head proposers (EAGLE-3 heads, a target's MTP layer) on a tiny random llama target:
greedy output token-identical to plain decoding (batched, preemption, prefix cache, overlap),
the head's cache rolled back after rejected drafts, heads that do not fit refused by name."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import torch

from model_fixtures import FIXTURES, cached_llm, fixture_model
from test_engine_e2e import staggered
from test_spec_decode import generate, looping_requests
from mlxr import LLM, SamplingParams
from mlxr.engine.spec_decode.eagle3 import load_eagle3
from mlxr.engine.spec_decode.heads import HeadProposer
from mlxr.engine.spec_decode.proposer import DraftRequest, StepHidden
from mlxr.errors import ModelFormatError
from mlxr.loader import load_model
from mlxr.testing.head_fixtures import write_eagle3_head, write_mtp_target

HEADS = FIXTURES / "heads-v1"


def target_dir() -> Path:
    return fixture_model("tiny-llama").hf_dir


def random_head(kind: str) -> tuple[str, str]:
    """(the model to load, the speculative_model) of a random head for tiny-llama."""
    out = HEADS / f"random-{kind}"
    if not (out / "model.safetensors").is_file():
        if kind == "eagle3":  # a draft vocabulary of half the target's: d2t maps it
            write_eagle3_head(target_dir(), out, seed=1, draft_vocab_size=256)
        else:
            write_mtp_target(target_dir(), out, seed=2)
    return (str(target_dir()) if kind == "eagle3" else str(out)), str(out)


def head_llm(kind: str, **kwargs) -> LLM:
    model, head = random_head(kind)
    return LLM(model, dtype="float32", speculative_method=kind, speculative_model=head, **kwargs)


@pytest.mark.parametrize("kind", ["eagle3", "mtp"])
def test_head_greedy_is_token_identical_batched(kind):
    reqs = looping_requests(10, seed=21)
    want = generate(cached_llm(str(target_dir())), reqs)
    spec = head_llm(kind, num_speculative_tokens=3, max_num_seqs=16, speculative_max_batch=16)
    assert generate(spec, reqs) == want
    s = spec.engine.stats()
    assert s.spec_num_draft_tokens > 0 and s.spec_num_accepted_tokens == sum(s.spec_accepted_per_position), s


@pytest.mark.parametrize("kind,swap,prefix", [("eagle3", 0.0, True), ("mtp", 0.001, False), ("eagle3", 0.001, True)])
def test_head_under_preemption_prefix_cache_and_overlap_is_token_identical(kind, swap, prefix):
    reqs = looping_requests(12, seed=5)
    reqs += [(reqs[0][0] + [7, 8], 12)]  # a cached prefix: the head starts after it
    want = generate(cached_llm(str(target_dir())), reqs)
    spec = head_llm(kind, num_kv_blocks=24, block_size=4, max_num_batched_tokens=64, max_num_seqs=16,
                    swap_space_gb=swap, enable_prefix_caching=prefix, overlap_steps=True, speculative_max_batch=16)
    assert staggered(spec, reqs, per_step=4)[0] == want
    s = spec.engine.stats()
    assert s.num_preemptions > 0 and s.spec_num_draft_tokens > 0 and s.kv_blocks_used == 0


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["eagle3", "mtp"])
def test_cuda_head_greedy_is_token_identical_with_overlap(kind):
    """On CUDA (tapped steps run eagerly; the rest of the engine as ever: overlap, graphs built)."""
    reqs = looping_requests(12, seed=23)
    want = generate(LLM(str(target_dir()), dtype="float32", device="cuda", engine_process=False), reqs)
    spec = head_llm(kind, device="cuda", engine_process=False, speculative_max_batch=16, num_speculative_tokens=3)
    assert generate(spec, reqs) == want
    assert spec.engine.stats().spec_num_draft_tokens > 0


def test_opted_out_and_sampled_requests_with_a_head():
    spec = head_llm("mtp", num_speculative_tokens=2)
    reqs = looping_requests(3, seed=9)
    before = spec.engine.stats().spec_num_drafts  # (the warm-up's requests drafted)
    assert generate(spec, reqs, speculative=False) == generate(cached_llm(str(target_dir())), reqs)
    assert spec.engine.stats().spec_num_drafts == before
    params = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.9, seed=3, ignore_eos=True)
    first = [o.outputs[0].token_ids for o in spec.generate([r for r, _ in reqs], params)]
    assert [o.outputs[0].token_ids for o in spec.generate([r for r, _ in reqs], params)] == first  # seeded
    assert spec.engine.stats().spec_num_drafts > before


def _proposer() -> HeadProposer:
    _, head_dir = random_head("eagle3")
    loaded = load_model(str(target_dir()), dtype=torch.float32, device="cpu")
    head = load_eagle3(head_dir, loaded.model, loaded.args, torch.float32, torch.device("cpu"))
    return HeadProposer(head, torch.float32, torch.device("cpu"), 4, 32)


def _hidden(rid: str, start: int, feats: torch.Tensor) -> StepHidden:
    """A step's hidden states (aux streams as the EAGLE-3 head takes them: three of hidden size)."""
    h = feats.shape[1] // 3
    return StepHidden([rid], [start], [len(feats)], feats[:, :h], list(feats.split(h, dim=1)))


def test_head_cache_rolls_back_rejected_drafts():
    """After a step whose drafts were partly rejected (their positions' features computed for
    other tokens, the head's cache written for its own drafts there), the head drafts exactly as
    one that only ever saw the kept tokens."""
    torch.manual_seed(0)
    tokens = torch.randint(3, 500, (40,)).tolist()
    feats = torch.randn(40, 3 * 64)
    greedy, sampled = SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)
    fresh = _proposer()
    fresh.take_hidden(_hidden("r", 0, feats[:30]))  # positions 0..29: the 31 tokens' last is uncomputed
    (want,) = fresh.propose([DraftRequest("r", tokens[:31], 3, greedy)])
    (want_q,) = fresh.propose([DraftRequest("r", tokens[:31], 1, sampled)])

    stepped = _proposer()
    stepped.take_hidden(_hidden("r", 0, feats[:25]))
    (first,) = stepped.propose([DraftRequest("r", tokens[:26], 4, greedy)])
    assert len(first.token_ids) == 4  # the head's cache now holds entries of its own drafts
    # the verify step computed positions 25..29 (the last token and 4 drafts); 4 of 4 kept
    # but the bonus token rejected nothing: then the next step's drafts (positions 30..32) were all
    # rejected: their features belong to other tokens
    stepped.take_hidden(_hidden("r", 25, feats[25:30]))
    stepped.take_hidden(_hidden("r", 30, torch.randn(3, 192)))
    (got,) = stepped.propose([DraftRequest("r", tokens[:31], 3, greedy)])
    (got_q,) = stepped.propose([DraftRequest("r", tokens[:31], 1, sampled)])
    assert got.token_ids == want.token_ids
    torch.testing.assert_close(got_q.probs, want_q.probs, rtol=1e-4, atol=1e-6)


def test_a_head_without_the_features_it_needs_drafts_nothing():
    p = _proposer()
    tokens = list(range(3, 23))
    (d,) = p.propose([DraftRequest("r", tokens, 3, SamplingParams())])
    assert d.token_ids == []  # no hidden states yet
    p.take_hidden(_hidden("r", 0, torch.randn(10, 192)))
    (d,) = p.propose([DraftRequest("r", tokens, 3, SamplingParams())])
    assert d.token_ids == []  # positions 10..18 never computed by the target
    p.retain(set())
    assert not p.seqs and len(p.free) == 32


def _bad_head(tmp_path: Path, edit) -> str:
    _, head = random_head("eagle3")
    out = tmp_path / "bad"
    shutil.copytree(head, out)
    config = json.loads((out / "config.json").read_text())
    tensors = safetensors.numpy.load_file(str(out / "model.safetensors"))
    edit(config, tensors)
    (out / "config.json").write_text(json.dumps(config))
    safetensors.numpy.save_file(tensors, str(out / "model.safetensors"))
    return str(out)


def _set(d, k, v):
    d[k] = v


@pytest.mark.parametrize("edit,message", [
    (lambda c, t: _set(c, "target_hidden_size", 128), "target of hidden size 128"),
    (lambda c, t: _set(t, "fc.weight", np.zeros((64, 128), np.float32)), "'fc.weight' has shape"),
    (lambda c, t: t.pop("midlayer.hidden_norm.weight"), "lacks tensors: midlayer.hidden_norm.weight"),
    (lambda c, t: _set(t, "d2t", t["d2t"] + 400), "outside the vocabulary"),
    (lambda c, t: _set(c, "eagle_config", {"eagle_aux_hidden_state_layer_ids": [0, 1, 5]}), "aux hidden state"),
    (lambda c, t: _set(c, "vocab_size", 1000), "vocabulary has 1000 tokens"),
    (lambda c, t: _set(t, "extra.weight", np.zeros(3, np.float32)), "unexpected tensor 'extra.weight'"),
])
def test_a_head_that_does_not_fit_the_target_is_refused(tmp_path, edit, message):
    head = _bad_head(tmp_path, edit)
    with pytest.raises(ModelFormatError, match=message):
        LLM(str(target_dir()), dtype="float32", speculative_method="eagle3", speculative_model=head)


def test_an_mtp_checkpoint_without_mtp_tensors_is_refused():
    with pytest.raises(ModelFormatError, match="no mtp.. tensors"):
        LLM(str(target_dir()), dtype="float32", speculative_method="mtp", speculative_model=str(target_dir()))
