"""Sampler tests: expected values come from the definitions, never from the sampler."""
from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from model_fixtures import cached_llm, fixture_model
from mlxr.engine.worker.sampler import SampledToken, Sampler, SamplingState, make_generator
from mlxr.ops.sampling.sampling import inverse_cdf_sample
from mlxr.types import SamplingParams

CPU = torch.device("cpu")
NEG_INF = float("-inf")


def state(
    prompt: list[int] | None = None,
    output: list[int] | None = None,
    eos: tuple[int, ...] = (),
    device: torch.device = CPU,
    **params: object,
) -> SamplingState:
    p = SamplingParams(**params)  # type: ignore[arg-type]
    return SamplingState(p, list(prompt or []), list(output or []), frozenset(eos),
                         make_generator(p.seed, device))


def draw_many(logits: torch.Tensor, n: int, **params: object) -> list[int]:
    """n independent draws for one row of logits, as one batch of n identical rows."""
    states = [state(**params) for _ in range(n)]
    return [t.token_id for t in Sampler()(logits.expand(n, -1).clone(), states)]


def assert_distribution(tokens: list[int], expected: dict[int, float]) -> None:
    """Only allowed tokens, and a chi-square statistic far below any plausible failure."""
    counts = Counter(tokens)
    assert set(counts) <= set(expected), f"disallowed tokens {set(counts) - set(expected)}"
    n = len(tokens)
    chi2 = sum((counts.get(t, 0) - n * p) ** 2 / (n * p) for t, p in expected.items())
    # df <= 5 here; chi2 > 25 has p < 1e-4, while a wrong distribution scores in the hundreds.
    assert chi2 < 25.0, (chi2, dict(counts), expected)


def probs_logits(probs: list[float]) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64).log().float()


# --- greedy and logprobs ---

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_equals_argmax(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    logits = (torch.randn(6, 300) * 3).to(dtype)
    out = Sampler()(logits, [state(temperature=0.0) for _ in range(6)])
    assert [t.token_id for t in out] == logits.float().argmax(dim=-1).tolist()


def test_logprobs_rank_top_match_raw_log_softmax() -> None:
    torch.manual_seed(1)
    logits = torch.randn(3, 64) * 2
    logits[1, :5] = NEG_INF
    ref = torch.log_softmax(logits.double(), dim=-1)
    fourth = int(ref[0].argsort(descending=True)[3])
    states = [
        # The bias forces the raw 4th-best token, so the raw rank must be 4.
        state(temperature=0.0, logprobs=5, logit_bias={fourth: 100.0}),
        state(temperature=0.8, logprobs=3, repetition_penalty=1.7, output=[7, 8, 9]),
        state(temperature=1.0, logprobs=None),
    ]
    out = Sampler()(logits, states)
    assert out[0].token_id == fourth and out[0].rank == 4
    # A row that asked for no logprobs gets none computed (rank 0: not ranked).
    assert out[2].rank == 0 and out[2].top_logprobs == []
    for row, (tok, n) in enumerate(zip(out[:2], [5, 3])):
        lp = ref[row]
        assert tok.logprob == pytest.approx(float(lp[tok.token_id]), abs=1e-5)
        assert tok.rank == 1 + int((lp > lp[tok.token_id]).sum())
        want = torch.topk(lp, n) if n else None
        assert [i for i, _ in tok.top_logprobs] == (want.indices.tolist() if want else [])
        for (_, v), w in zip(tok.top_logprobs, want.values.tolist() if want else []):
            assert v == pytest.approx(w, abs=1e-5)


# --- logit processors, checked on processed_logits against the definitions ---

def test_logit_bias_adds_to_named_tokens() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    got = Sampler().processed_logits(logits, [state(logit_bias={0: 5.0, 3: -2.5, 99: 1.0})])
    assert got.tolist() == [[6.0, 2.0, 3.0, 1.5]]


def test_repetition_penalty_hf_semantics() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -4.0]])
    # Prompt and output both count; token 3 was never seen.
    s = state(prompt=[0, 4], output=[1, 1], repetition_penalty=2.0)
    got = Sampler().processed_logits(logits, [s])
    assert got.tolist() == [[1.0, -2.0, 0.5, 3.0, -8.0]]
    s.prompt_token_ids.append(3)  # the cached prompt ids must follow a changed prompt
    assert Sampler().processed_logits(logits, [s]).tolist() == [[1.0, -2.0, 0.5, 1.5, -8.0]]


def test_presence_and_frequency_penalty_openai_semantics() -> None:
    logits = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    # Prompt tokens are not penalised; counts come from the output only.
    s = state(prompt=[3, 3], output=[2, 2, 2, 1], presence_penalty=0.5, frequency_penalty=0.25)
    got = Sampler().processed_logits(logits, [s])
    expected = [1.0, 1.0 - 0.5 - 0.25 * 1, 1.0 - 0.5 - 0.25 * 3, 1.0]
    assert got[0].tolist() == pytest.approx(expected)


def test_penalty_order_repetition_then_presence() -> None:
    logits = torch.tensor([[4.0, 0.0]])
    s = state(output=[0], repetition_penalty=2.0, presence_penalty=1.0)
    got = Sampler().processed_logits(logits, [s])
    assert got[0, 0].item() == pytest.approx(4.0 / 2.0 - 1.0)  # not (4 - 1) / 2


def test_penalties_are_per_row() -> None:
    logits = torch.tensor([[2.0, 2.0], [2.0, 2.0]])
    states = [state(output=[0], frequency_penalty=1.0), state(output=[1])]
    assert Sampler().processed_logits(logits, states).tolist() == [[1.0, 2.0], [2.0, 2.0]]


def test_min_tokens_blocks_eos_and_stop_ids_even_with_ignore_eos() -> None:
    logits = torch.tensor([[0.0, 5.0, 4.0, 1.0]])  # eos=1 is the favourite, stop id 2 next
    sampler = Sampler()
    for ignore_eos in (False, True):
        s = state(output=[3, 3], eos=(1,), min_tokens=3, stop_token_ids=[2],
                  temperature=0.0, ignore_eos=ignore_eos)
        assert sampler(logits, [s])[0].token_id == 3
        s.output_token_ids.append(3)  # min_tokens reached: eos is allowed again
        assert sampler(logits, [s])[0].token_id == 1


def test_min_tokens_blocks_eos_when_sampling() -> None:
    torch.manual_seed(2)
    tokens = draw_many(torch.tensor([0.0, 10.0, 0.0]), 2000, eos=(1,), min_tokens=1)
    assert 1 not in tokens and len(set(tokens)) == 2


# --- random sampling: allowed sets and distributions ---

def test_temperature_distribution() -> None:
    torch.manual_seed(3)
    logits = torch.tensor([1.0, 0.0, -1.0, 0.5])
    t = 0.5
    want = torch.softmax(logits.double() / t, dim=-1).tolist()
    assert_distribution(draw_many(logits, 6000, temperature=t), dict(enumerate(want)))


def test_top_k_per_row() -> None:
    torch.manual_seed(4)
    probs = [0.07, 0.3, 0.1, 0.25, 0.2, 0.08]
    logits = probs_logits(probs)
    for k, allowed in ((2, [1, 3]), (4, [1, 3, 4, 2])):
        mass = sum(probs[i] for i in allowed)
        expected = {i: probs[i] / mass for i in allowed}
        assert_distribution(draw_many(logits, 5000, top_k=k), expected)
    # Different k in one batch: each row keeps its own set.
    states = [state(top_k=1 + (i % 2)) for i in range(400)]
    out = Sampler()(logits.expand(400, -1).clone(), states)
    assert {t.token_id for t in out[0::2]} == {1}
    assert {t.token_id for t in out[1::2]} == {1, 3}


def test_top_p_nucleus() -> None:
    torch.manual_seed(5)
    probs = [0.5, 0.2, 0.15, 0.1, 0.05]
    # Mass before tokens 0..3 is 0, .5, .7, .85: top_p=.8 keeps tokens 0, 1, 2.
    expected = {0: 0.5 / 0.85, 1: 0.2 / 0.85, 2: 0.15 / 0.85}
    assert_distribution(draw_many(probs_logits(probs), 6000, top_p=0.8), expected)


def test_min_p() -> None:
    torch.manual_seed(6)
    probs = [0.3, 0.5, 0.1, 0.06, 0.04]
    # Threshold 0.15 * 0.5 = 0.075 keeps tokens 0, 1, 2.
    expected = {0: 0.3 / 0.9, 1: 0.5 / 0.9, 2: 0.1 / 0.9}
    assert_distribution(draw_many(probs_logits(probs), 6000, min_p=0.15), expected)


def test_top_k_then_top_p() -> None:
    torch.manual_seed(7)
    probs = [0.4, 0.3, 0.2, 0.1]
    # top_k=3 renormalises to .444/.333/.222; then top_p=.7 keeps tokens 0 and 1.
    expected = {0: 0.4 / 0.7, 1: 0.3 / 0.7}
    assert_distribution(draw_many(probs_logits(probs), 5000, top_k=3, top_p=0.7), expected)


@pytest.mark.parametrize("block", [4, 8, 1024])
def test_inverse_cdf_matches_quantiles_across_blocks(block: int) -> None:
    torch.manual_seed(10)
    logits = torch.randn(1, 37)
    logits[0, [0, 3, 4, 8, 15, 36]] = NEG_INF  # masked, some on block edges
    probs = torch.softmax(logits.double(), dim=-1)[0]
    n = 20000
    # Stratified uniforms: token i must get n * p_i draws, give or take one.
    u = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    tokens = inverse_cdf_sample(logits.expand(n, -1).contiguous(), u, block=block)
    counts = torch.bincount(tokens, minlength=37).double()
    assert (counts - n * probs).abs().max() <= 1.5
    # u == 1.0 stands in for u * total rounding up to the total.
    edges = torch.tensor([0.0, math.nextafter(1.0, 0.0), 1.0], dtype=torch.float64)
    first_last = inverse_cdf_sample(logits.expand(3, -1).contiguous(), edges, block=block)
    assert first_last.tolist() == [1, 35, 35]


# --- seeds ---

def run_steps(seed_row: int, batch: int, steps: int, seed: int,
              device: torch.device = CPU) -> list[int]:
    """Generate `steps` tokens for a seeded row at position seed_row among noisy neighbours."""
    states = [state(device=device, temperature=1.0, top_p=0.95) for _ in range(batch)]
    states[seed_row] = state(device=device, seed=seed, temperature=0.9, top_k=500)
    if batch > 2:
        states[(seed_row + 1) % batch] = state(device=device, seed=seed + 1)
        states[(seed_row + 2) % batch] = state(device=device, temperature=0.0)
    gen = torch.Generator().manual_seed(99)
    base = torch.randn(steps, 1000, generator=gen)
    tokens = []
    sampler = Sampler()
    for step in range(steps):
        logits = torch.randn(batch, 1000) * 2  # neighbours see different logits every time
        logits[seed_row] = base[step]
        tokens.append(sampler(logits.to(device), states)[seed_row].token_id)
    return tokens


def test_seed_reproducible_across_batches_and_positions() -> None:
    alone = run_steps(0, 1, 20, seed=1234)
    assert run_steps(3, 5, 20, seed=1234) == alone
    assert run_steps(1, 8, 20, seed=1234) == alone
    assert run_steps(0, 1, 20, seed=1235) != alone


def test_negative_and_huge_seeds_are_accepted() -> None:
    for seed in (-(1 << 63), (1 << 64) - 1, 0):
        assert make_generator(seed, CPU) is not None
    assert make_generator(None, CPU) is None


# --- robustness ---

@pytest.mark.parametrize("params", [
    dict(temperature=1e-6),
    dict(temperature=1e-6, top_p=1e-9),
    dict(top_p=1e-9),
    dict(top_k=1),
    dict(min_p=1.0),
    dict(temperature=100.0, top_k=-1, min_p=1e-9),
    dict(temperature=1e-6, logit_bias={5: -100.0, 6: 100.0}),
    dict(repetition_penalty=100.0, presence_penalty=2.0, frequency_penalty=-2.0),
    dict(repetition_penalty=1e-6, temperature=1e-6),
])
def test_extreme_values_stay_finite(params: dict) -> None:
    torch.manual_seed(8)
    logits = torch.randn(4, 50) * 1e4
    logits[:, :10] = NEG_INF
    logits[1, 10:] = 1e33
    logits[1, 33] = 3e33
    logits[2, 10:] = NEG_INF
    logits[2, 20] = -5.0
    states = [state(prompt=[11, 12], output=[13, 13, 6], logprobs=0, **params) for _ in range(4)]
    out = Sampler()(logits, states)
    for row, tok in enumerate(out):
        assert 10 <= tok.token_id < 50 or row == 2
        assert math.isfinite(tok.logprob) and tok.rank >= 1
    assert out[2].token_id == 20
    if params.get("temperature") == 1e-6 or params.get("top_k") == 1 or params.get("min_p") == 1.0:
        processed = Sampler().processed_logits(logits, states)
        # Near-deterministic settings pick a best processed token (several may tie).
        chosen = processed.gather(1, torch.tensor([[t.token_id] for t in out]))
        assert torch.equal(chosen.squeeze(1), processed.amax(dim=-1))


def test_all_tokens_masked_falls_back_to_a_valid_token() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0], [NEG_INF, NEG_INF, NEG_INF]])
    states = [state(eos=(0, 1, 2), min_tokens=5, temperature=0.0, logprobs=2),
              state(logprobs=3)]
    out: list[SampledToken] = Sampler()(logits, states)
    assert out[0].token_id == 1 and math.isfinite(out[0].logprob)
    assert 0 <= out[1].token_id < 3
    assert all(math.isfinite(v) for t in out for _, v in t.top_logprobs)


def test_nan_and_posinf_logits_do_not_poison_the_row() -> None:
    # Not legal model output, but a broken step must not crash or pick a NaN token.
    logits = torch.tensor([[0.0, float("nan"), float("inf"), 1.0]] * 2)
    out = Sampler()(logits, [state(temperature=0.0, logprobs=2), state(top_p=0.5)])
    assert [t.token_id for t in out] == [2, 2]
    assert all(math.isfinite(v) for t in out for v in [t.logprob] + [v for _, v in t.top_logprobs])


def test_plain_greedy_batch_handles_nan_inf_and_empty_rows() -> None:
    # Every row greedy with nothing to adjust: the sampler's argmax-only path.
    logits = torch.tensor([[0.0, float("nan"), float("inf"), 1.0], [NEG_INF] * 4, [0.5, 3.0, 2.0, 1.0]])
    states = [state(temperature=0.0) for _ in range(3)]
    assert all(s.plain for s in states)
    assert [t.token_id for t in Sampler()(logits, states)] == [2, 0, 1]


def test_one_penalised_row_keeps_a_greedy_batch_off_the_plain_path() -> None:
    logits = torch.tensor([[0.5, 3.0, 2.0, 1.0]] * 2)
    states = [state(temperature=0.0), state(temperature=0.0, output=[1], repetition_penalty=50.0)]
    assert not states[1].plain
    assert [t.token_id for t in Sampler()(logits, states)] == [1, 2]


def test_mixed_greedy_and_random_batch() -> None:
    torch.manual_seed(9)
    logits = torch.randn(6, 200)
    states = [
        state(temperature=0.0),
        state(seed=7, temperature=1.3),
        state(temperature=0.0, output=[int(logits[2].argmax())], repetition_penalty=50.0),
        state(temperature=1.0, top_k=1),
        state(temperature=0.7, top_p=0.5),
        state(temperature=0.0, logprobs=2),
    ]
    out = Sampler()(logits, states)
    assert out[0].token_id == int(logits[0].argmax())
    assert out[2].token_id == int(logits[2].topk(2).indices[1])  # the penalised best loses
    assert out[3].token_id == int(logits[3].argmax())
    assert out[5].token_id == int(logits[5].argmax()) and len(out[5].top_logprobs) == 2
    alone = Sampler()(logits[1:2], [state(seed=7, temperature=1.3)])
    assert out[1].token_id == alone[0].token_id


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_seeded_and_extreme() -> None:
    cuda = torch.device("cuda")
    assert run_steps(2, 6, 10, 42, cuda) == run_steps(0, 1, 10, 42, cuda)
    logits = torch.randn(3, 32000, device=cuda, dtype=torch.bfloat16)
    logits[:, :100] = NEG_INF
    states = [state(device=cuda, temperature=1e-6, top_p=1e-9, seed=1),
              state(device=cuda, min_p=1.0, output=[5], repetition_penalty=3.0),
              state(device=cuda, temperature=0.0, logprobs=20)]
    out = Sampler()(logits, states)
    assert all(math.isfinite(t.logprob) and t.token_id >= 100 for t in out)
    assert out[2].token_id == int(logits[2].float().argmax())


# --- parameters under float32's range (found by the schemathesis suite: top_p 3.2e-71) ---

def test_a_top_p_that_underflows_keeps_the_most_likely_token() -> None:
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.5]])
    out = Sampler()(logits, [state(temperature=1.0, top_p=3.2e-71, seed=0)])
    assert out[0].token_id == 1  # float32(3.2e-71) == 0: no token may be dropped past the first


def test_a_temperature_under_1e_minus_5_is_greedy() -> None:
    assert SamplingParams(temperature=1e-300).greedy and SamplingParams(temperature=9e-6).greedy
    assert not SamplingParams(temperature=1e-5).greedy
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.5], [3.0, 0.0, 0.0, 2.9]])
    out = Sampler()(logits, [state(temperature=1e-300, seed=0), state(temperature=1e-40, seed=1)])
    assert [t.token_id for t in out] == [1, 0]  # float32 would make these temperatures 0: NaN logits


def test_tiny_temperature_and_top_p_generate_the_greedy_text() -> None:
    llm = cached_llm(str(fixture_model("tiny-llama").hf_dir))
    greedy = llm.generate(["a b c"], SamplingParams(max_tokens=6, temperature=0.0))[0].outputs[0].token_ids
    for kw in ({"temperature": 1e-300}, {"top_p": 3.2e-71, "seed": 3}):
        out = llm.generate(["a b c"], SamplingParams(max_tokens=6, **kw))[0].outputs[0].token_ids
        assert out == greedy, kw
