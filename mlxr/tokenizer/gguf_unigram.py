"""T5-style unigram vocabularies from GGUF metadata (`tokenizer.ggml.model == "t5"`): pieces
with log-probabilities, the SentencePiece normalization table the file carries, and the
pre-tokenizer T5's own tokenizer uses (whitespace split, then "\u2581" before every word)."""
from __future__ import annotations

from collections.abc import Sequence

import tokenizers
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers

from mlxr.errors import ModelFormatError

UNKNOWN, CONTROL = 2, 3  # llama.cpp token types
SPACE = "\u2581"


def build_t5_unigram(
    tokens: Sequence[str],
    scores: Sequence[float],
    types: Sequence[int],
    unk_id: int,
    charsmap: bytes | None,
) -> tokenizers.Tokenizer:
    try:
        model = models.Unigram(list(zip(tokens, map(float, scores))), unk_id, False)
    except Exception as e:  # tokenizers raises plain Exception on a bad vocabulary
        raise ModelFormatError(f"unigram vocabulary is inconsistent: {e}") from e
    tok = tokenizers.Tokenizer(model)
    if charsmap:
        try:
            tok.normalizer = normalizers.Precompiled(charsmap)
        except Exception as e:
            raise ModelFormatError(f"tokenizer.ggml.precompiled_charsmap is malformed: {e}") from e
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always", split=True),
    ])
    tok.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="always", split=True)
    first = {}
    for i, t in enumerate(tokens):
        first.setdefault(t, i)
    # T5's tokenizer counts <unk> among its special tokens (matched whole, skipped on decode).
    special = [
        t for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (UNKNOWN, CONTROL) and first[t] == i
    ]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special if t])
    return tok
