"""Turn one step's logits into one token per running sequence.

Per row, in vLLM / HF order: logit_bias, min_tokens masking, repetition penalty,
presence/frequency penalties; then argmax (temperature 0) or temperature, top_k, top_p,
min_p and a draw from the row's own generator. Logprobs are reported from the raw logits.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable

import torch

from mlxr.engine.worker.transfers import HostCopy, to_device
from mlxr.ops.sampling import sampling as ops
from mlxr.types import SamplingParams

# JSON cannot carry -inf; vLLM's OpenAI server reports impossible tokens with this value.
LOGPROB_FLOOR = -9999.0


@dataclass
class SamplingState:
    """What the sampler needs to know about one running sequence; the engine owns it."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    eos_token_ids: frozenset[int]
    generator: torch.Generator | None
    # The prompt's distinct in-vocab ids on the device, built once: the prompt is fixed
    # and turning a long Python list into a tensor every step costs milliseconds.
    _prompt_ids: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)
    _prompt_key: tuple[int, int, str] = field(default=(-1, -1, ""), init=False, repr=False,
                                              compare=False)

    def __post_init__(self) -> None:
        p = self.params
        # Greedy with nothing to adjust or report: argmax alone (checked per row every step).
        self.plain = p.greedy and not _has_processors(p) and p.logprobs is None

    def prompt_ids_tensor(self, vocab: int, device: torch.device) -> torch.Tensor:
        """Distinct prompt ids in [0, vocab) as a long tensor on device (cached)."""
        key = (len(self.prompt_token_ids), vocab, str(device))
        if self._prompt_ids is None or self._prompt_key != key:
            ids = torch.unique(torch.tensor(self.prompt_token_ids, dtype=torch.long))
            self._prompt_ids = ids[(ids >= 0) & (ids < vocab)].to(device)
            self._prompt_key = key
        return self._prompt_ids


@dataclass
class SampledToken:
    """One sampled token; logprob, rank and top_logprobs are under the raw logits."""

    token_id: int
    logprob: float
    rank: int
    top_logprobs: list[tuple[int, float]]


def make_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    """A per-request generator for a seeded request; None means the shared default one."""
    if seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def _rows_where(states: list[SamplingState], pred: Callable[[SamplingParams], bool]) -> list[int]:
    return [i for i, s in enumerate(states) if pred(s.params)]


def _flat_index(
    id_lists: list[list[int]], row_ids: list[int], vocab: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, token) index tensors for every id in id_lists[j] on row row_ids[j].

    Ids outside [0, vocab) are dropped: a tokenizer or a request may name ids the
    model's output layer does not have, and that must not crash a whole batch.
    """
    lengths = torch.tensor([len(ids) for ids in id_lists], dtype=torch.long)
    rows = torch.repeat_interleave(torch.tensor(row_ids, dtype=torch.long), lengths)
    cols = torch.tensor(list(itertools.chain.from_iterable(id_lists)), dtype=torch.long)
    keep = (cols >= 0) & (cols < vocab)
    return to_device(rows[keep], torch.long, device), to_device(cols[keep], torch.long, device)


def _has_processors(p: SamplingParams) -> bool:
    return bool(p.logit_bias) or p.min_tokens > 0 or p.repetition_penalty != 1.0 \
        or p.presence_penalty != 0 or p.frequency_penalty != 0


def _top_k(params: SamplingParams, vocab: int) -> int:
    return params.top_k if 0 < params.top_k < vocab else vocab


def _param_tensor(values: list[float], device: torch.device) -> torch.Tensor:
    return to_device(values, torch.float32, device)


def _index_tensor(rows: list[int], device: torch.device) -> torch.Tensor:
    return to_device(rows, torch.long, device)


def _on_rows(x: torch.Tensor, rows: list[int], fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """x[rows] = fn(x[rows]), without a gather when every row is involved."""
    if not rows:
        return
    if len(rows) == x.shape[0]:
        x.copy_(fn(x))
        return
    idx = _index_tensor(rows, x.device)
    x[idx] = fn(x[idx])


@dataclass
class LastTokens:
    """Each row's last token while it is still on the device only (overlapped steps):
    row i's is tokens[rows[i]], or it has none (rows[i] is None). Penalties and min_tokens
    count it as an output token."""

    tokens: torch.Tensor
    rows: list[int | None]

    def pairs(self, rows: list[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, token) index tensors of the given rows' pending tokens."""
        have = [i for i in rows if self.rows[i] is not None]
        r = _index_tensor(have, device)
        return r, self.tokens[_index_tensor([self.rows[i] for i in have], device)]

    def count(self, i: int) -> int:
        return 0 if self.rows[i] is None else 1

    @staticmethod
    def none(device: torch.device, n: int) -> "LastTokens":
        return LastTokens(torch.empty(0, dtype=torch.long, device=device), [None] * n)


@dataclass
class Samples:
    """One step's tokens on the host, one a row; `stats` (one SampledToken a row) only when
    some row asked for logprobs: a large greedy batch builds no object per row."""

    token_ids: list[int]
    stats: list[SampledToken] | None

    def as_list(self) -> list[SampledToken]:
        if self.stats is not None:
            return self.stats
        return [SampledToken(t, LOGPROB_FLOOR, 0, []) for t in self.token_ids]


class SampleFuture:
    """One step's sampled tokens: on the device at once (`tokens`, for the next step's
    inputs), on the host when `result()` is called (it waits for the copy, not the stream)."""

    def __init__(self, tokens: torch.Tensor, copy: HostCopy, has_stats: bool, wanted: list[int]) -> None:
        self.tokens = tokens
        self._copy, self._has_stats, self._wanted = copy, has_stats, wanted

    def result(self) -> Samples:
        host = self._copy.get()
        tokens = host[0].tolist()
        if not self._has_stats:
            return Samples(tokens, None)
        logprob, rank = host[1].tolist(), host[2].tolist()
        tops = _top_lists(host[3], host[4], self._wanted) if len(host) > 3 else [[] for _ in tokens]
        return Samples(tokens, [
            SampledToken(t, LOGPROB_FLOOR if lp != lp or lp == float("-inf") else lp, rk, top)
            for t, lp, rk, top in zip(tokens, logprob, rank, tops)
        ])


def _top_lists(values: torch.Tensor, ids: torch.Tensor, wanted: list[int]) -> list[list[tuple[int, float]]]:
    values_l, ids_l = values.tolist(), ids.tolist()
    return [list(zip(ids_l[i][:n], values_l[i][:n])) for i, n in enumerate(wanted)]


class Sampler:
    """Batched sampler: __call__(logits [B, V], states) -> one SampledToken per row.
    `launch` queues the same work on the device and returns before it has run."""

    def __call__(self, logits: torch.Tensor, states: list[SamplingState]) -> list[SampledToken]:
        return self.launch(logits, states).result().as_list()

    def launch(self, logits: torch.Tensor, states: list[SamplingState],
               pending: LastTokens | None = None, bitmask=None) -> SampleFuture:
        """Nothing here waits for the device: host-side parameters travel through pinned
        memory, and the results come back through an event. bitmask (structured output): a
        packed int32 [rows, ceil(vocab / 32)] on the host, or a callable that waits for one
        still being filled; a clear bit bans its token, before anything but the random draws,
        so logprobs are those of the allowed tokens (as vLLM reports them)."""
        assert logits.dim() == 2 and logits.shape[0] == len(states), (logits.shape, len(states))
        raw = ops.sanitize(logits)
        plain = all(s.plain for s in states)
        # Random rows' draws first: they need no logits, and a pending mask fills meanwhile.
        rand = [] if plain else _rows_where(states, lambda p: not p.greedy)
        uniforms = self._uniforms([states[i] for i in rand], raw.device) if rand else None
        if bitmask is not None:
            if not isinstance(bitmask, torch.Tensor):
                bitmask = bitmask()  # structured output's PendingMask
            ops.apply_token_bitmask_(raw, to_device(bitmask, torch.int32, raw.device))
        if plain:
            # An all -inf row picks token 0 here as after _rescue_empty_rows: that step is moot.
            tokens = raw.argmax(dim=-1)
            return SampleFuture(tokens, HostCopy([tokens]), False, [])
        pending = pending or LastTokens.none(raw.device, len(states))
        tokens = self._choose(self._process(raw, states, pending), states, rand, uniforms)
        return self._future(raw, tokens, states)

    def processed_logits(self, logits: torch.Tensor, states: list[SamplingState]) -> torch.Tensor:
        """float32 logits after bias, min_tokens and penalties (before temperature)."""
        raw = ops.sanitize(logits)
        return self._process(raw, states, LastTokens.none(raw.device, len(states)))

    def _process(self, raw: torch.Tensor, states: list[SamplingState], pending: LastTokens) -> torch.Tensor:
        if not any(_has_processors(s.params) for s in states):
            return self._rescue_empty_rows(raw, raw)
        x = raw.clone()
        self._apply_logit_bias(x, states)
        self._apply_min_tokens(x, states, pending)
        self._apply_repetition_penalty(x, states, pending)
        self._apply_presence_frequency(x, states, pending)
        return self._rescue_empty_rows(x, raw)

    # --- logit processors (in place, on the rows that use them) ---

    def _apply_logit_bias(self, x: torch.Tensor, states: list[SamplingState]) -> None:
        rows = _rows_where(states, lambda p: bool(p.logit_bias))
        if not rows:
            return
        biases = [states[i].params.logit_bias or {} for i in rows]
        r, c = _flat_index([list(b) for b in biases], rows, x.shape[1], x.device)
        values = [v for b in biases for t, v in b.items() if 0 <= t < x.shape[1]]
        ops.add_values_(x, r, c, _param_tensor(values, x.device))

    def _apply_min_tokens(self, x: torch.Tensor, states: list[SamplingState], pending: LastTokens) -> None:
        # Masked even with ignore_eos: that flag only changes stopping, not sampling.
        rows = [i for i, s in enumerate(states)
                if len(s.output_token_ids) + pending.count(i) < s.params.min_tokens]
        if not rows:
            return
        banned = [sorted(states[i].eos_token_ids | set(states[i].params.stop_token_ids or []))
                  for i in rows]
        r, c = _flat_index(banned, rows, x.shape[1], x.device)
        ops.set_values_(x, r, c, torch.full((r.numel(),), ops.NEG_INF, device=x.device))

    def _apply_repetition_penalty(self, x: torch.Tensor, states: list[SamplingState], pending: LastTokens) -> None:
        rows = _rows_where(states, lambda p: p.repetition_penalty != 1.0)
        if not rows:
            return
        vocab, device = x.shape[1], x.device
        prompts = [states[i].prompt_ids_tensor(vocab, device) for i in rows]
        r_out, c_out = _flat_index([states[i].output_token_ids for i in rows], rows, vocab, device)
        total = sum(t.numel() for t in prompts)
        lengths = _index_tensor([t.numel() for t in prompts], device)
        r_prompt = torch.repeat_interleave(_index_tensor(rows, device), lengths, output_size=total)
        r_pend, c_pend = pending.pairs(rows, device)
        # Repeated (row, token) pairs are harmless: each writes the same penalised value.
        r, c = torch.cat([r_prompt, r_out, r_pend]), torch.cat(prompts + [c_out, c_pend])
        penalty = torch.ones(x.shape[0], dtype=torch.float32)
        penalty[rows] = torch.tensor([states[i].params.repetition_penalty for i in rows])
        ops.repetition_penalty_(x, r, c, to_device(penalty, torch.float32, device))

    def _apply_presence_frequency(self, x: torch.Tensor, states: list[SamplingState], pending: LastTokens) -> None:
        rows = _rows_where(states, lambda p: p.presence_penalty != 0 or p.frequency_penalty != 0)
        rows = [i for i in rows if states[i].output_token_ids or pending.count(i)]
        if not rows:
            return
        r, c = _flat_index([states[i].output_token_ids for i in rows], rows, x.shape[1], x.device)
        r_pend, c_pend = pending.pairs(rows, x.device)
        r, c, counts = ops.unique_pairs(torch.cat([r, r_pend]), torch.cat([c, c_pend]), x.shape[1])
        presence = torch.zeros(x.shape[0], dtype=torch.float32)
        frequency = torch.zeros(x.shape[0], dtype=torch.float32)
        presence[rows] = torch.tensor([states[i].params.presence_penalty for i in rows])
        frequency[rows] = torch.tensor([states[i].params.frequency_penalty for i in rows])
        ops.presence_frequency_(x, r, c, counts, to_device(presence, torch.float32, x.device),
                                to_device(frequency, torch.float32, x.device))

    @staticmethod
    def _rescue_empty_rows(x: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
        """A row with every token masked falls back to its raw logits, then to uniform
        (computed for every row: asking whether any row is empty would wait for the device)."""
        fallback = raw.masked_fill(raw.amax(dim=-1, keepdim=True) == ops.NEG_INF, 0.0)
        if x is raw:  # nothing processed: the fallback is the answer (two passes of a large vocabulary fewer)
            return fallback
        return torch.where(x.amax(dim=-1, keepdim=True) == ops.NEG_INF, fallback, x)

    # --- choosing tokens ---

    def _choose(self, x: torch.Tensor, states: list[SamplingState], rand: list[int],
                uniforms: torch.Tensor | None) -> torch.Tensor:
        """rand: the random rows; uniforms: their draws (_uniforms)."""
        if not rand:
            return x.argmax(dim=-1)
        if len(rand) == len(states):
            return self._sample(x, states, uniforms)
        greedy = _rows_where(states, lambda p: p.greedy)
        tokens = torch.empty(x.shape[0], dtype=torch.long, device=x.device)
        idx = _index_tensor(greedy, x.device)
        tokens[idx] = x[idx].argmax(dim=-1)
        idx = _index_tensor(rand, x.device)
        tokens[idx] = self._sample(x[idx], [states[i] for i in rand], uniforms)
        return tokens

    def _sample(self, x: torch.Tensor, states: list[SamplingState], uniforms: torch.Tensor) -> torch.Tensor:
        """Random rows only: temperature, top_k/top_p, min_p, then one draw per row."""
        return ops.inverse_cdf_sample(self.filtered_logits(x, states), uniforms)

    @staticmethod
    def filtered_logits(x: torch.Tensor, states: list[SamplingState]) -> torch.Tensor:
        """Random rows' processed logits after temperature, top_k/top_p and min_p: their
        softmax is the distribution a token is drawn from (the verifier's target p)."""
        vocab, device = x.shape[1], x.device
        params = [s.params for s in states]
        x = ops.apply_temperature(x, _param_tensor([p.temperature for p in params], device))
        # Rows with a top_k are kept apart so that their sort is a partial top-k.
        with_k = [i for i, p in enumerate(params) if 0 < p.top_k < vocab]
        only_p = [i for i, p in enumerate(params) if not 0 < p.top_k < vocab and p.top_p < 1.0]
        for rows in (with_k, only_p):
            if not rows:
                continue
            ks = [_top_k(params[i], vocab) for i in rows]
            k = _index_tensor(ks, device)
            p_t = _param_tensor([params[i].top_p for i in rows], device)
            _on_rows(x, rows, lambda t: ops.apply_top_k_top_p(t, k, p_t, max(ks)))
        min_p = [i for i, p in enumerate(params) if p.min_p > 0.0]
        m_t = _param_tensor([params[i].min_p for i in min_p], device)
        _on_rows(x, min_p, lambda t: ops.apply_min_p(t, m_t))
        return x

    @staticmethod
    def _uniforms(states: list[SamplingState], device: torch.device) -> torch.Tensor:
        """One U[0, 1) per row. A seeded row takes exactly one number from its own
        generator per step, so its tokens do not depend on the rest of the batch."""
        u = torch.empty(len(states), dtype=torch.float64, device=device)
        shared = [i for i, s in enumerate(states) if s.generator is None]
        if shared:
            idx = _index_tensor(shared, device)
            u[idx] = torch.rand(len(shared), dtype=torch.float64, device=device)
        for i, s in enumerate(states):
            if s.generator is not None:
                u[i : i + 1].uniform_(generator=s.generator)
        return u

    # --- reporting ---

    @staticmethod
    def _future(raw: torch.Tensor, tokens: torch.Tensor, states: list[SamplingState]) -> SampleFuture:
        """Queue the copies of what the host needs: tokens, and logprob figures only when
        some row asked for them (a logsumexp over a 262k vocabulary costs ms on a CPU)."""
        wanted = [min(s.params.logprobs or 0, raw.shape[1]) for s in states]
        if not any(s.params.logprobs is not None for s in states):
            return SampleFuture(tokens, HostCopy([tokens]), False, wanted)
        logprob, rank, lse = Sampler._logprob_stats(raw, tokens, states)
        parts = [tokens, logprob, rank]
        n_max = max(wanted, default=0)
        if n_max:
            values, ids = raw.topk(n_max, dim=-1)
            parts += [(values - lse.unsqueeze(-1)).nan_to_num(nan=LOGPROB_FLOOR, neginf=LOGPROB_FLOOR), ids]
        return SampleFuture(tokens, HostCopy(parts), True, wanted)

    @staticmethod
    def _logprob_stats(raw: torch.Tensor, tokens: torch.Tensor,
                       states: list[SamplingState]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """ops.raw_logprob_stats for the rows that asked for logprobs (NaN, rank 0 elsewhere):
        a logsumexp over a 262k vocabulary costs milliseconds per step on a CPU."""
        want = [i for i, s in enumerate(states) if s.params.logprobs is not None]
        if len(want) == len(states):
            return ops.raw_logprob_stats(raw, tokens)
        logprob = torch.full(tokens.shape, float("nan"), device=raw.device)
        rank = torch.zeros(tokens.shape, dtype=torch.int64, device=raw.device)
        lse = torch.full(tokens.shape, float("nan"), device=raw.device)
        if want:
            idx = _index_tensor(want, raw.device)
            logprob[idx], rank[idx], lse[idx] = ops.raw_logprob_stats(raw[idx], tokens[idx])
        return logprob, rank, lse
