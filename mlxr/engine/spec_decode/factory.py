"""The speculator an EngineConfig asks for, built from the engine core's parts."""
from __future__ import annotations

import logging

from mlxr.config import EngineConfig
from mlxr.engine.spec_decode.draft_model import DraftModelProposer
from mlxr.engine.spec_decode.ngram import NgramProposer
from mlxr.engine.spec_decode.speculator import Speculator
from mlxr.errors import InvalidParameterError

log = logging.getLogger(__name__)


def make_speculator(parts, config: EngineConfig, num_blocks: int, max_blocks_per_seq: int) -> Speculator | None:
    """parts: the engine's CoreParts (parts.draft holds the draft model's)."""
    method = config.speculative_method
    if method is None:
        return None
    if method == "ngram":
        proposer = NgramProposer()
    else:
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
    return Speculator(proposer, config.num_speculative_tokens, config.speculative_max_batch)
