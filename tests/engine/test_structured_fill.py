"""The structured-output mask fill: both ways of filling a batch (this thread, llguidance's
executor) are tried and give llguidance's own single-row masks, on matchers from the engine's
compiler. (That each request's matcher has a lexer of its own shows only in timing:
bench/probes/mask_fill.py.)"""
from __future__ import annotations

import llguidance
import llguidance.torch as llg_torch
import pytest
import torch

from model_fixtures import fixture_model
from structured_schemas import SCHEMAS
from mlxr.engine.structured.compiler import GrammarCompiler
from mlxr.engine.structured.fill import PARALLEL_ROWS, TRIALS, MaskFiller
from mlxr.tokenizer.tokenizer import Tokenizer
from mlxr.types import StructuredOutputsParams as SO

ROWS = 2 * PARALLEL_ROWS


def compiler() -> GrammarCompiler:
    tok = Tokenizer.from_hf_dir(fixture_model("tiny-llama").hf_dir)
    return GrammarCompiler(tok, tok.vocab_size)


def reference(matcher, words: int) -> torch.Tensor:
    mask = torch.zeros((1, words), dtype=torch.int32)
    llg_torch.fill_next_token_bitmask(matcher, mask, 0)
    return mask[0]


@pytest.mark.parametrize("own_serial_executor", [False, True])
def test_both_fills_are_tried_and_match_llguidance_row_by_row(own_serial_executor):
    """own_serial_executor: the one-thread executor of serial fills given, as the engine does,
    or made by the filler."""
    comp = compiler()
    words = (comp.vocab_size + 31) // 32
    states = [comp.compile(SO(json=SCHEMAS["record_like"])) for _ in range(ROWS)]
    serial = llguidance.LLExecutor(num_threads=1) if own_serial_executor else None
    filler = MaskFiller(llguidance.LLExecutor(num_threads=2), serial)
    for step in range(2 * TRIALS + 2):
        mask = torch.full((ROWS, words), -1, dtype=torch.int32)
        filler.fill([(s.matcher, i) for i, s in enumerate(states)], mask)
        for i, s in enumerate(states):
            assert torch.equal(mask[i], reference(s.matcher, words)), (step, i)
            allowed = [t for t in range(comp.vocab_size) if (int(mask[i, t // 32]) >> (t % 32)) & 1]
            if not s.matcher.is_stopped():
                assert s.matcher.consume_token(allowed[(7 * i + step) % len(allowed)])
    kinds = filler.timing.by_kind
    assert kinds["serial"][1] >= TRIALS * ROWS and kinds["parallel"][1] >= TRIALS * ROWS
    assert all(v is not None for v in filler.us_per_row.values())


def test_a_few_rows_are_filled_in_this_thread():
    comp = compiler()
    state = comp.compile(SO(regex="[a-z]{3}"))
    filler = MaskFiller(llguidance.LLExecutor(num_threads=2))
    mask = torch.full((1, (comp.vocab_size + 31) // 32), -1, dtype=torch.int32)
    filler.fill([(state.matcher, 0)], mask)
    assert filler.timing.by_kind["parallel"][1] == 0 and filler.timing.rows == 1


def test_a_vocabulary_llguidance_cannot_read_is_a_400_naming_it_every_time(monkeypatch):
    from mlxr.errors import InvalidParameterError

    tok = Tokenizer.from_hf_dir(fixture_model("tiny-llama").hf_dir)
    calls = []

    def unreadable() -> str:
        calls.append(1)
        return '{"model": {"type": "NoSuchModel"}}'

    monkeypatch.setattr(tok, "backend_json", unreadable)
    comp = GrammarCompiler(tok, tok.vocab_size)
    for _ in range(2):
        with pytest.raises(InvalidParameterError, match="tokenizer cannot drive a grammar") as err:
            comp.compile(SO(json_object=True))
        assert err.value.param == "structured_outputs"
    assert len(calls) == 1  # refused once, remembered
    comp.shutdown()
