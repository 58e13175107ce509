"""WordPiece (BERT) vocabularies from GGUF metadata (`tokenizer.ggml.model == "bert"`).

llama.cpp's converter rewrites BERT's vocabulary: a word-initial piece gets a "\u2581" prefix, a
continuation piece loses its "##", and control tokens stay as they are. This undoes that and
builds the tokenizer BERT's own tokenizer.json describes: BERT's normalizer and pre-tokenizer,
greedy longest-match WordPiece, and [CLS] text [SEP] around every input.
"""
from __future__ import annotations

from collections.abc import Sequence

import tokenizers
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, processors

from mlxr.errors import ModelFormatError

CONTROL = 3  # llama.cpp token type
WORD_START = "\u2581"
CONTINUATION = "##"


def build_wordpiece(
    tokens: Sequence[str],
    types: Sequence[int],
    *,
    lowercase: bool,
    strip_accents: bool,
    unk_id: int,
    cls_id: int,
    sep_id: int,
) -> tokenizers.Tokenizer:
    """BERT's tokenizer over a GGUF "bert" vocabulary (the ids are the file's)."""
    pieces = [_original_piece(t, ty) for t, ty in zip(tokens, types)]
    vocab: dict[str, int] = {}
    for i, piece in enumerate(pieces):
        vocab.setdefault(piece, i)
    try:
        model = models.WordPiece(vocab, unk_token=pieces[unk_id], continuing_subword_prefix=CONTINUATION)
    except Exception as e:  # tokenizers raises plain Exception on a bad vocabulary
        raise ModelFormatError(f"WordPiece vocabulary is inconsistent: {e}") from e
    tok = tokenizers.Tokenizer(model)
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=strip_accents, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix=CONTINUATION)
    control = [p for i, (p, ty) in enumerate(zip(pieces, types)) if ty == CONTROL and vocab[p] == i]
    tok.add_special_tokens([AddedToken(p, special=True, normalized=False) for p in control if p])
    cls, sep = pieces[cls_id], pieces[sep_id]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, cls_id), (sep, sep_id)],
    )
    return tok


def _original_piece(token: str, token_type: int) -> str:
    if token_type == CONTROL:
        return token
    if token.startswith(WORD_START):
        return token[len(WORD_START):]
    return CONTINUATION + token
