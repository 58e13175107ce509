"""The speculator an EngineConfig asks for, built from the engine core's parts."""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from mlxr.config import HEAD_METHODS, EngineConfig
from mlxr.engine.spec_decode.batch_policy import DraftBudget, load_costs
from mlxr.engine.spec_decode.draft_model import DraftModelProposer
from mlxr.engine.spec_decode.ngram import NgramProposer
from mlxr.engine.spec_decode.proposer import Proposer
from mlxr.engine.spec_decode.speculator import Speculator
from mlxr.engine.spec_decode.suffix import SuffixProposer
from mlxr.errors import InvalidParameterError

log = logging.getLogger(__name__)


def make_speculator(parts, config: EngineConfig, num_blocks: int, max_blocks_per_seq: int,
                    max_rows: int | None = None) -> Speculator | None:
    """parts: the engine's CoreParts (parts.draft holds the draft model's); max_rows: a step's
    rows at most, drafts included (the largest CUDA graph), or None."""
    proposer = _proposer(parts, config, num_blocks, max_blocks_per_seq)
    jump_forward = jumps_forward(config, parts)
    if proposer is None and not jump_forward:
        return None
    # Forced drafts stay within the batch where speculation pays. Past it a drafting step's host
    # work (its masks per position, verification, the forced tokens' lookup; no overlap with
    # the device) costs more than the steps it saves: SmolLM2 at batch 64, a schema per request,
    # 0.46 of unconstrained tok/s with them against 0.63 without on an H200, 0.53 against 0.79 on
    # 2 CPU cores; at batch 1 1.23 against 0.79 on the H200, 1.45 against 0.96 on the CPU
    # (bench/structured_overhead.py; docs/structured-output.md).
    budget = draft_budget(config, parts.device) if proposer is not None else None
    return Speculator(proposer, config.num_speculative_tokens, config.speculative_max_batch, jump_forward, max_rows,
                      budget)


BUNDLED_COST_TABLE = Path(__file__).with_name("cost_table.json")  # bench/kernels/spec_cost_table.py writes it


def draft_budget(config: EngineConfig, device: torch.device) -> DraftBudget | None:
    """The measured step costs' budget for this device, or None (no table, no entry for the
    device, a draft model's proposer (each draft costs it a forward the table leaves out):
    the fixed speculative_max_batch cut-off)."""
    path = config.speculative_cost_table
    if path == "none" or config.speculative_method not in ("ngram", "suffix"):
        return None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    costs = load_costs(Path(path) if path else BUNDLED_COST_TABLE, name)
    if costs is None:
        log.info("no speculative cost table entry for %s: no drafts past %d requests", name,
                 config.speculative_max_batch)
    return None if costs is None else DraftBudget(costs)


def jumps_forward(config: EngineConfig, parts) -> bool:
    """Whether grammars' forced tokens draft (not under tensor parallelism: parts.make_runner)."""
    return config.jump_forward and parts.make_runner is None


def _proposer(parts, config: EngineConfig, num_blocks: int, max_blocks_per_seq: int) -> Proposer | None:
    method = config.speculative_method
    if method is None:
        return None
    if method == "ngram":
        return NgramProposer()
    if method == "suffix":
        return SuffixProposer(config.suffix)
    if method in HEAD_METHODS:
        return _head_proposer(parts, config, num_blocks)
    draft = parts.draft
    if draft is None:
        raise InvalidParameterError("speculative_draft_model", "was not loaded")
    if draft.args.vocab_size != parts.args.vocab_size:  # (a server may serve several models)
        log.warning("no speculative decoding for this model: the draft model's vocabulary has %d tokens, "
                    "the model's %d", draft.args.vocab_size, parts.args.vocab_size)
        return None
    proposer = DraftModelProposer(draft.model, draft.args, draft.dtype, draft.device,
                                  config.block_size, num_blocks)
    if draft.device.type == "cuda" and config.enable_cuda_graphs:
        proposer.enable_cuda_graphs(min(config.speculative_max_batch, config.max_num_seqs), max_blocks_per_seq)
    return proposer


def _head_proposer(parts, config: EngineConfig, num_blocks: int) -> Proposer:
    """An EAGLE-3 head or the target's MTP layer (docs/speculative-decoding.md)."""
    from mlxr.engine.spec_decode.heads import HeadProposer

    if parts.make_runner is not None:
        raise InvalidParameterError("speculative_method", f"{config.speculative_method!r} is not offered under "
                                                          "tensor parallelism")
    if config.speculative_method == "eagle3":
        from mlxr.engine.spec_decode.eagle3 import load_eagle3

        head = load_eagle3(config.speculative_model, parts.model, parts.args, parts.dtype, parts.device)
    else:
        from mlxr.engine.spec_decode.mtp import load_mtp

        head = load_mtp(config.speculative_model, parts.model, parts.args, parts.dtype, parts.device,
                        read_mtp=parts.read_mtp)
    return HeadProposer(head, parts.dtype, parts.device, config.block_size, num_blocks)


def connect_hidden_states(speculator: Speculator | None, runner) -> None:
    """Give the runner a tap of the target's hidden states where the proposer drafts from them."""
    proposer = None if speculator is None else speculator.proposer
    if proposer is not None and hasattr(proposer, "take_hidden"):
        from mlxr.engine.worker.hidden_tap import HiddenTap

        runner.hidden_tap = HiddenTap(runner.model, proposer)
