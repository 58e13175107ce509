"""Verify a decode row's drafts against the target's logits at each of its 1 + k positions.

Temperature 0: the target's argmax at each position; drafts are kept while they equal it,
then the argmax where they first differ (or the bonus position's when all matched): exactly
the greedy tokens. Temperature > 0: lossless rejection sampling (Leviathan et al. 2023, Chen
et al. 2023): draft d_j, sampled from q_j, is kept with probability min(1, p_j(d) / q_j(d)); the
first rejected one is replaced by a draw from normalize(max(0, p_j - q_j)); all kept, a bonus
token is drawn from p_k. A certain draft (n-gram) has q = one-hot. p is the distribution the
plain sampler draws from at that position (processors with the drafts as earlier outputs,
temperature, top_k/top_p, min_p), so the tokens are distributed exactly as without drafts."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from mlxr.engine.records import TokenLogprob
from mlxr.engine.worker.sampler import LOGPROB_FLOOR, LastTokens, Sampler, SamplingState, _has_processors
from mlxr.engine.worker.transfers import to_device
from mlxr.ops.sampling import sampling as ops


@dataclass
class Verdict:
    """One row's tokens after verification: its accepted drafts, then one more."""

    token_ids: list[int]
    logprobs: list[TokenLogprob] | None

    @property
    def num_accepted(self) -> int:
        return len(self.token_ids) - 1


def _position_states(state: SamplingState, drafts: list[int]) -> list[SamplingState]:
    """The sampling state at each of the 1 + k positions: position j has seen drafts[:j]."""
    if not _has_processors(state.params):
        return [state] * (len(drafts) + 1)
    return [SamplingState(state.params, state.prompt_token_ids, state.output_token_ids + drafts[:j],
                          state.eos_token_ids, state.generator) for j in range(len(drafts) + 1)]


class RejectionSampler:
    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def verify(self, logits: torch.Tensor, request_ids: list[str], states: list[SamplingState],
               drafts: list[list[int]], draft_probs: list[torch.Tensor | None],
               masks: torch.Tensor | None = None) -> list[Verdict]:
        """logits: [sum(1 + k_i), vocab] raw float32, row i's positions contiguous. masks
        (structured output): the packed token bitmask of each of those positions (the grammar's
        state after the row's drafts before it), applied to the raw logits as the plain sampler
        applies a step's: a draft the grammar refuses has probability 0 and is rejected."""
        raw = ops.sanitize(logits)
        if masks is not None:
            ops.apply_token_bitmask_(raw, to_device(masks, torch.int32, raw.device))
        pos_states = [s for st, d in zip(states, drafts) for s in _position_states(st, d)]
        x = self.sampler._process(raw, pos_states, LastTokens.none(raw.device, len(pos_states)))
        offsets = [0]
        for d in drafts:
            offsets.append(offsets[-1] + len(d) + 1)
        tokens: list[list[int] | None] = [None] * len(states)
        greedy = [i for i, s in enumerate(states) if s.params.greedy]
        rand = [i for i, s in enumerate(states) if not s.params.greedy]
        if greedy:
            self._verify_greedy(x, greedy, offsets, drafts, tokens)
        if rand:
            self._verify_random(x, rand, offsets, states, pos_states, drafts, draft_probs, tokens)
        logprobs = self._logprobs(raw, offsets, states, tokens)
        return [Verdict(t, lp) for t, lp in zip(tokens, logprobs)]

    @staticmethod
    def _verify_greedy(x: torch.Tensor, rows: list[int], offsets: list[int], drafts: list[list[int]],
                       tokens: list) -> None:
        idx = to_device([p for i in rows for p in range(offsets[i], offsets[i + 1])], torch.long, x.device)
        best = x.index_select(0, idx).argmax(dim=-1).tolist()
        at = 0
        for i in rows:
            d = drafts[i]
            target = best[at: at + len(d) + 1]
            at += len(d) + 1
            a = 0
            while a < len(d) and d[a] == target[a]:
                a += 1
            tokens[i] = d[:a] + [target[a]]

    def _verify_random(self, x: torch.Tensor, rows: list[int], offsets: list[int], states: list[SamplingState],
                       pos_states: list[SamplingState], drafts: list[list[int]],
                       draft_probs: list[torch.Tensor | None], tokens: list) -> None:
        device = x.device
        positions = [p for i in rows for p in range(offsets[i], offsets[i + 1])]
        idx = to_device(positions, torch.long, device)
        p = self.sampler.filtered_logits(x.index_select(0, idx), [pos_states[j] for j in positions]).softmax(-1)
        local = {}  # row -> its first position in p
        at = 0
        for i in rows:
            local[i] = at
            at += len(drafts[i]) + 1
        p_at, q_at = self._draft_probabilities(p, rows, local, drafts, draft_probs)
        uniforms = self._uniforms(rows, states, drafts, device)
        kept = []
        for i in rows:
            d, u = drafts[i], uniforms[i]
            a = 0
            while a < len(d) and u[a] * q_at[i][a] < p_at[i][a]:
                a += 1
            tokens[i] = d[:a]
            kept.append(a)
        finals = self._final_distributions(p, rows, local, kept, drafts, draft_probs)
        final_u = torch.tensor([uniforms[i][-1] for i in rows], dtype=torch.float64, device=device)
        for i, t in zip(rows, ops.inverse_cdf_sample(finals.log(), final_u).tolist()):
            tokens[i].append(t)

    @staticmethod
    def _draft_probabilities(p: torch.Tensor, rows: list[int], local: dict[int, int], drafts: list[list[int]],
                             draft_probs: list[torch.Tensor | None]) -> tuple[dict, dict]:
        """p_j(d_j) and q_j(d_j) of every draft, on the host."""
        pos = [local[i] + j for i in rows for j in range(len(drafts[i]))]
        tok = [t for i in rows for t in drafts[i]]
        flat_p = p[to_device(pos, torch.long, p.device), to_device(tok, torch.long, p.device)].tolist()
        p_at, q_at, at = {}, {}, 0
        for i in rows:
            k = len(drafts[i])
            p_at[i] = flat_p[at: at + k]
            at += k
            q = draft_probs[i]
            if q is None:
                q_at[i] = [1.0] * k
            else:
                d = torch.tensor(drafts[i], dtype=torch.long, device=q.device)
                q_at[i] = q[:k].gather(1, d.unsqueeze(1)).squeeze(1).tolist()
        return p_at, q_at

    @staticmethod
    def _final_distributions(p: torch.Tensor, rows: list[int], local: dict[int, int], kept: list[int],
                             drafts: list[list[int]], draft_probs: list[torch.Tensor | None]) -> torch.Tensor:
        """Each row's distribution for its last token, [len(rows), vocab]: the bonus position's
        p when every draft was kept, else the residual max(0, p - q) at the first rejected one
        (p itself where rounding leaves no residual mass). Batched: a step may verify a row
        of drafts for each of 64 requests (forced tokens of their grammars)."""
        at = to_device([local[i] + a for i, a in zip(rows, kept)], torch.long, p.device)
        base = p.index_select(0, at)
        residual = base.clone()
        certain = [(j, drafts[i][a]) for j, (i, a) in enumerate(zip(rows, kept))
                   if a < len(drafts[i]) and draft_probs[i] is None]
        if certain:  # a one-hot q: the rejected draft's probability goes
            where = to_device([j for j, _ in certain] + [t for _, t in certain], torch.long, p.device)
            residual.index_put_((where[: len(certain)], where[len(certain):]), torch.zeros((), device=p.device))
        for j, (i, a) in enumerate(zip(rows, kept)):
            q = draft_probs[i]
            if a < len(drafts[i]) and q is not None:
                residual[j] = (base[j] - q[a].to(p.device)).clamp_min_(0.0)
        return torch.where(residual.sum(-1, keepdim=True) > 0, residual, base)

    @staticmethod
    def _uniforms(rows: list[int], states: list[SamplingState], drafts: list[list[int]],
                  device: torch.device) -> dict[int, list[float]]:
        """k + 1 uniforms per row; a seeded row draws them from its own generator. One copy to
        the host for all rows."""
        draws = []
        for i in rows:
            gen, n = states[i].generator, len(drafts[i]) + 1
            draws.append(torch.rand(n, dtype=torch.float64, device=device) if gen is None
                         else torch.empty(n, dtype=torch.float64, device=device).uniform_(generator=gen))
        flat = torch.cat(draws).tolist()
        out, at = {}, 0
        for i in rows:
            n = len(drafts[i]) + 1
            out[i] = flat[at: at + n]
            at += n
        return out

    @staticmethod
    def _logprobs(raw: torch.Tensor, offsets: list[int], states: list[SamplingState],
                  tokens: list[list[int]]) -> list[list[TokenLogprob] | None]:
        """Each emitted token's logprob, rank and top alternatives under the raw logits."""
        want = [i for i, s in enumerate(states) if s.params.logprobs is not None]
        out: list[list[TokenLogprob] | None] = [None] * len(states)
        if not want:
            return out
        pos = [offsets[i] + j for i in want for j in range(len(tokens[i]))]
        tok = [t for i in want for t in tokens[i]]
        rows = raw.index_select(0, to_device(pos, torch.long, raw.device))
        chosen = to_device(tok, torch.long, raw.device)
        logprob, rank, lse = ops.raw_logprob_stats(rows, chosen)
        n_top = max(min(states[i].params.logprobs or 0, raw.shape[1]) for i in want)
        values, ids = rows.topk(n_top, dim=-1) if n_top else (rows[:, :0], rows[:, :0].long())
        values = (values - lse.unsqueeze(-1)).nan_to_num(nan=LOGPROB_FLOOR, neginf=LOGPROB_FLOOR)
        lp, rk, vs, ix = logprob.tolist(), rank.tolist(), values.tolist(), ids.tolist()
        at = 0
        for i in want:
            n = min(states[i].params.logprobs or 0, raw.shape[1])
            out[i] = []
            for t in tokens[i]:
                v = lp[at]
                v = LOGPROB_FLOOR if v != v or v == float("-inf") else v
                out[i].append(TokenLogprob(t, v, rk[at], list(zip(ix[at][:n], vs[at][:n]))))
                at += 1
        return out
