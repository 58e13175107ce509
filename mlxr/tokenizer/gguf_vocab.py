"""Build a `tokenizers.Tokenizer` from GGUF tokenizer metadata (llama.cpp key names).

Vocabulary kinds (`tokenizer.ggml.model`): "llama" (SentencePiece-style pieces with scores and
byte fallback, rebuilt as a BPE whose merges are derived from the scores), "gpt2" and
"whitespace" (BPE with explicit merges and a named pre-tokenizer, see gguf_pre_tokenizers),
"gemma4" (SentencePiece-style BPE with explicit merges), "bert" (WordPiece, see
gguf_wordpiece) and "t5" (unigram, see gguf_unigram).
"""
from __future__ import annotations

import logging
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tokenizers
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers

from mlxr.errors import ModelFormatError, UnsupportedModelError
from mlxr.tokenizer.gguf_pre_tokenizers import PreTokenizerSpec, build_pre_tokenizer, pre_tokenizer_spec
from mlxr.tokenizer.gguf_unigram import build_t5_unigram
from mlxr.tokenizer.gguf_wordpiece import build_wordpiece

log = logging.getLogger(__name__)

# llama.cpp token types
UNDEFINED, NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = range(7)

# Real vocabularies stay far below this; the cap bounds work done on untrusted counts.
MAX_VOCAB = 1 << 22
SPACE = "\u2581"
# SentencePiece's trainer keeps pieces to 16 characters unless told otherwise; longer ones in a
# file get no merges, which bounds the work a hostile vocabulary can ask of derive_merges.
MAX_MERGED_PIECE = 256


@dataclass(frozen=True)
class GGUFVocab:
    """A tokenizer built from GGUF metadata plus the special-token facts the file states."""

    tokenizer: tokenizers.Tokenizer
    bos_token_id: int | None
    eos_token_id: int | None
    unk_token_id: int | None
    pad_token_id: int | None
    add_bos: bool | None  # None (both): the tokenizer's post-processor adds the specials
    add_eos: bool | None
    extra_stop_ids: tuple[int, ...]
    chat_template: str | None
    architecture: str | None


def vocab_from_gguf_metadata(metadata: Mapping[str, Any]) -> GGUFVocab:
    """Validate the `tokenizer.*` metadata and build the tokenizer it describes."""
    kind = _get_str(metadata, "tokenizer.ggml.model")
    if kind is None:
        raise ModelFormatError("GGUF metadata has no tokenizer.ggml.model")
    tokens = _str_list(metadata, "tokenizer.ggml.tokens", None)
    if tokens is None or not tokens:
        raise ModelFormatError("GGUF metadata has no tokenizer.ggml.tokens")
    n = len(tokens)
    types = _int_list(metadata, "tokenizer.ggml.token_type", n)
    types = types if types is not None else [NORMAL] * n
    if any(t < UNDEFINED or t > BYTE for t in types):
        raise ModelFormatError("tokenizer.ggml.token_type holds a value outside 0..6")
    tok, default_bos, default_eos = _build(kind, metadata, tokens, types)
    ids = {k: _get_id(metadata, f"tokenizer.ggml.{k}_token_id", n)
           for k in ("bos", "eos", "unknown", "padding", "eot", "eom")}
    return GGUFVocab(
        tokenizer=tok,
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        unk_token_id=ids["unknown"],
        pad_token_id=ids["padding"],
        add_bos=None if default_bos is None
        else _get_bool(metadata, "tokenizer.ggml.add_bos_token", default_bos),
        add_eos=None if default_bos is None
        else _get_bool(metadata, "tokenizer.ggml.add_eos_token", default_eos),
        extra_stop_ids=tuple(i for i in (ids["eot"], ids["eom"]) if i is not None),
        chat_template=_get_str(metadata, "tokenizer.chat_template"),
        architecture=_get_str(metadata, "general.architecture"),
    )


def _build(
    kind: str, metadata: Mapping[str, Any], tokens: list[str], types: list[int]
) -> tuple[tokenizers.Tokenizer, bool | None, bool]:
    """The tokenizer, and whether this kind of vocabulary adds BOS and EOS when the file does
    not say (BOS None: its post-processor adds what the model wants, as BERT's [CLS] [SEP])."""
    n = len(tokens)
    merges = _merge_list(metadata)
    if kind == "llama":
        scores = _float_list(metadata, "tokenizer.ggml.scores", n)
        if scores is None and merges is None:
            raise ModelFormatError("a llama (SentencePiece) vocabulary needs tokenizer.ggml.scores")
        prefix = _get_bool(metadata, "tokenizer.ggml.add_space_prefix", True)
        return build_sentencepiece_bpe(tokens, scores or [0.0] * n, types, prefix, merges), True, False
    if kind in ("gpt2", "whitespace", "gemma4"):
        if merges is None:
            raise ModelFormatError(f"a {kind} (BPE) vocabulary needs tokenizer.ggml.merges")
        # The gemma4 and whitespace kinds name their split themselves.
        spec = pre_tokenizer_spec(kind if kind != "gpt2" else _get_str(metadata, "tokenizer.ggml.pre"))
        if not spec.byte_level and not spec.regexes:  # SentencePiece-style BPE (Gemma 4)
            prefix = _get_bool(metadata, "tokenizer.ggml.add_space_prefix", False)
            return build_sentencepiece_bpe(tokens, [0.0] * n, types, prefix, merges), False, False
        return build_bpe(tokens, types, merges, spec), False, False
    if kind == "bert":
        return _wordpiece(metadata, tokens, types), None, False
    if kind == "t5":
        return _t5_unigram(metadata, tokens, types), False, True
    raise UnsupportedModelError(
        f"GGUF tokenizer model {kind!r} is not supported (llama, gpt2, gemma4, bert, t5, whitespace)")


def _t5_unigram(
    metadata: Mapping[str, Any], tokens: list[str], types: list[int]
) -> tokenizers.Tokenizer:
    n = len(tokens)
    scores = _float_list(metadata, "tokenizer.ggml.scores", n)
    if scores is None:
        raise ModelFormatError("a t5 (unigram) vocabulary needs tokenizer.ggml.scores")
    unk = _get_id(metadata, "tokenizer.ggml.unknown_token_id", n)
    charsmap = _int_list(metadata, "tokenizer.ggml.precompiled_charsmap", None)
    table = bytes(b & 0xFF for b in charsmap) if charsmap else None  # stored as int8 or uint8
    return build_t5_unigram(tokens, scores, types, 2 if unk is None else unk, table)


def _wordpiece(
    metadata: Mapping[str, Any], tokens: list[str], types: list[int]
) -> tokenizers.Tokenizer:
    n = len(tokens)
    lowercase = _get_bool(metadata, "tokenizer.ggml.normalizer.lowercase", True)
    ids = {}
    for key, default in (("unknown", 100), ("bos", 101), ("seperator", 102)):  # llama.cpp's spelling
        found = _get_id(metadata, f"tokenizer.ggml.{key}_token_id", n)
        ids[key] = default if found is None else found
        if not 0 <= ids[key] < n:
            raise ModelFormatError(f"a bert vocabulary needs tokenizer.ggml.{key}_token_id")
    return build_wordpiece(
        tokens, types, lowercase=lowercase,
        strip_accents=_get_bool(metadata, "tokenizer.ggml.normalizer.strip_accents", lowercase),
        unk_id=ids["unknown"], cls_id=ids["bos"], sep_id=ids["seperator"],
    )


def build_sentencepiece_bpe(
    tokens: Sequence[str],
    scores: Sequence[float],
    types: Sequence[int],
    add_space_prefix: bool,
    merges: Sequence[tuple[str, str]] | None = None,
    pre_normalizers: Sequence[normalizers.Normalizer] = (),
) -> tokenizers.Tokenizer:
    """A BPE with byte fallback equivalent to SentencePiece's score-ordered piece merging."""
    spelled = [_respell_spaces(t) if ty == USER_DEFINED else t for t, ty in zip(tokens, types)]
    vocab = _first_ids(spelled)
    if merges is None:
        merges = derive_merges(spelled, scores, types)
    unk = next((t for t, ty in zip(spelled, types) if ty == UNKNOWN), None)
    model = _make_bpe(vocab, list(merges), unk_token=unk, fuse_unk=True, byte_fallback=True)
    tok = _sentencepiece_pipeline(tokenizers.Tokenizer(model), add_space_prefix, pre_normalizers)
    # A respelled run of spaces is reached through merges, not matched as an added token.
    added_types = [NORMAL if s != t else ty for s, t, ty in zip(spelled, tokens, types)]
    _add_special_tokens(tok, spelled, added_types, vocab)
    return tok


def build_sentencepiece_unigram(
    tokens: Sequence[str],
    scores: Sequence[float],
    types: Sequence[int],
    add_space_prefix: bool,
    byte_fallback: bool,
    pre_normalizers: Sequence[normalizers.Normalizer] = (),
) -> tokenizers.Tokenizer:
    """A SentencePiece unigram model (pieces with log-probabilities)."""
    unk_id = next((i for i, ty in enumerate(types) if ty == UNKNOWN), None)
    try:
        model = models.Unigram(list(zip(tokens, map(float, scores))), unk_id, byte_fallback)
    except Exception as e:  # tokenizers raises plain Exception on a bad vocabulary
        raise ModelFormatError(f"SentencePiece vocabulary is inconsistent: {e}") from e
    tok = _sentencepiece_pipeline(tokenizers.Tokenizer(model), add_space_prefix, pre_normalizers)
    _add_special_tokens(tok, tokens, types, _first_ids(tokens))
    return tok


def _sentencepiece_pipeline(
    tok: tokenizers.Tokenizer, add_space_prefix: bool, pre_normalizers: Sequence[normalizers.Normalizer]
) -> tokenizers.Tokenizer:
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    norm = list(pre_normalizers)
    if add_space_prefix:
        # A normalizer runs on each stretch of text between added tokens, so this prefixes
        # every stretch, as llama.cpp and SentencePiece's own prefix do (even before a space).
        norm.append(normalizers.Prepend(SPACE))
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    norm.append(normalizers.Replace(" ", SPACE))
    if norm:
        tok.normalizer = norm[0] if len(norm) == 1 else normalizers.Sequence(norm)
    tok.decoder = decoders.Sequence(steps)
    return tok


def build_bpe(
    tokens: Sequence[str],
    types: Sequence[int],
    merges: Sequence[tuple[str, str]],
    spec: PreTokenizerSpec,
) -> tokenizers.Tokenizer:
    """A BPE with explicit merges cutting text as `spec` says (`tokenizer.ggml.pre`); GPT-2's
    byte alphabet unless the spec runs on raw text."""
    if spec.byte_level:
        alphabet = frozenset(pre_tokenizers.ByteLevel.alphabet())
        spelling = byte_level_spelling()
        # Added tokens keep their raw text so they can be matched whole; normal tokens must be
        # in the byte alphabet, and a file that stores them raw gets them respelled.
        tokens = [
            t if ty in (CONTROL, USER_DEFINED) or set(t) <= alphabet
            else "".join(spelling[b] for b in t.encode("utf-8"))
            for t, ty in zip(tokens, types)
        ]
    vocab = _first_ids(tokens)
    tok = tokenizers.Tokenizer(_make_bpe(vocab, list(merges), ignore_merges=spec.ignore_merges))
    tok.pre_tokenizer = build_pre_tokenizer(spec)
    tok.decoder = decoders.ByteLevel() if spec.byte_level else decoders.Fuse()
    _add_special_tokens(tok, tokens, types, vocab)
    return tok


def derive_merges(
    tokens: Sequence[str], scores: Sequence[float], types: Sequence[int]
) -> list[tuple[str, str]]:
    """Merges implied by a SentencePiece vocabulary, best first.

    User-defined pieces come first (SentencePiece matches them whole), then normal pieces by
    score; among the splits of one piece the longer left part wins, as transformers orders them.
    The work is at most the vocabulary's size in characters times MAX_MERGED_PIECE: longer
    pieces get no merges, and only cuts into two lengths that some piece has are looked up.
    """
    pieces = {t: i for i, t in enumerate(tokens) if types[i] in (NORMAL, USER_DEFINED, UNDEFINED)}
    lengths = {len(t) for t in pieces if len(t) <= MAX_MERGED_PIECE}
    find = pieces.get
    ranked: list[tuple[tuple[float, ...], str, str]] = []
    too_long = 0
    for piece, i in pieces.items():
        size = len(piece)
        if size > MAX_MERGED_PIECE:
            too_long += 1
            continue
        group = (0.0, float(i)) if types[i] == USER_DEFINED else (1.0, -float(scores[i]))
        for cut in range(1, size):
            if cut not in lengths or size - cut not in lengths:
                continue
            left, right = piece[:cut], piece[cut:]
            left_id = find(left)
            right_id = find(right) if left_id is not None else None
            if right_id is not None:
                ranked.append(((*group, -cut, cut - size, i, left_id, right_id), left, right))
    if too_long:
        log.warning("%d SentencePiece pieces are longer than %d characters; text reaches them "
                    "only in shorter pieces", too_long, MAX_MERGED_PIECE)
    ranked.sort(key=lambda r: r[0])
    return [(left, right) for _, left, right in ranked]


def byte_level_spelling() -> dict[int, str]:
    """GPT-2's byte -> printable character table (printable bytes map to themselves)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _respell_spaces(token: str) -> str:
    # Gemma files store runs of spaces as real spaces, but after the space->U+2581
    # normalization text can only reach them spelled with U+2581.
    return SPACE * len(token) if " " in token and not token.strip() else token


def _first_ids(tokens: Sequence[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    return vocab


def _make_bpe(vocab: dict[str, int], merges: list[tuple[str, str]], **kw: Any) -> models.BPE:
    try:
        return models.BPE(vocab=vocab, merges=merges, dropout=None, **kw)
    except Exception as e:  # tokenizers raises plain Exception for unknown merge pieces
        raise ModelFormatError(f"GGUF vocabulary is inconsistent: {e}") from e


def _add_special_tokens(
    tok: tokenizers.Tokenizer, spelled: Sequence[str], types: Sequence[int], vocab: dict[str, int]
) -> None:
    # Control tokens are special (skipped on decode); user-defined ones are plain added
    # tokens. Both must be matched whole in text, as llama.cpp does.
    special = [t for i, (t, ty) in enumerate(zip(spelled, types)) if ty == CONTROL and vocab[t] == i]
    user = [
        t for i, (t, ty) in enumerate(zip(spelled, types))
        if ty == USER_DEFINED and vocab[t] == i
    ]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special if t])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user if t])


def _get_str(metadata: Mapping[str, Any], key: str) -> str | None:
    value = metadata.get(key)
    if value is not None and not isinstance(value, str):
        raise ModelFormatError(f"GGUF metadata {key} must be a string, got {type(value).__name__}")
    return value


def _get_bool(metadata: Mapping[str, Any], key: str, default: bool) -> bool:
    value = metadata.get(key)
    if value is None:
        return default
    if not isinstance(value, (bool, numbers.Integral)):
        raise ModelFormatError(f"GGUF metadata {key} must be a bool, got {type(value).__name__}")
    return bool(value)


def _get_id(metadata: Mapping[str, Any], key: str, n: int) -> int | None:
    value = metadata.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ModelFormatError(f"GGUF metadata {key} must be an integer")
    if not 0 <= int(value) < n:
        raise ModelFormatError(f"GGUF metadata {key}={value} is outside the vocabulary (size {n})")
    return int(value)


def _list(metadata: Mapping[str, Any], key: str, n: int | None) -> list[Any] | None:
    value = metadata.get(key)
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or (
        not isinstance(value, Sequence) and not hasattr(value, "tolist")
    ):
        raise ModelFormatError(f"GGUF metadata {key} must be an array")
    items = value.tolist() if hasattr(value, "tolist") else list(value)
    if len(items) > MAX_VOCAB:
        raise ModelFormatError(f"GGUF metadata {key} has {len(items)} entries (limit {MAX_VOCAB})")
    if n is not None and len(items) != n:
        raise ModelFormatError(f"GGUF metadata {key} has {len(items)} entries, expected {n}")
    return items


def _str_list(metadata: Mapping[str, Any], key: str, n: int | None) -> list[str] | None:
    items = _list(metadata, key, n)
    if items is not None and not all(isinstance(x, str) for x in items):
        raise ModelFormatError(f"GGUF metadata {key} must hold strings")
    return items


def _int_list(metadata: Mapping[str, Any], key: str, n: int | None) -> list[int] | None:
    items = _list(metadata, key, n)
    if items is not None and not _all_of(items, int, numbers.Integral):
        raise ModelFormatError(f"GGUF metadata {key} must hold integers")
    return None if items is None else [int(x) for x in items]


def _float_list(metadata: Mapping[str, Any], key: str, n: int) -> list[float] | None:
    items = _list(metadata, key, n)
    if items is not None and not _all_of(items, float, numbers.Real):
        raise ModelFormatError(f"GGUF metadata {key} must hold numbers")
    return None if items is None else [float(x) for x in items]


def _all_of(items: list[Any], fast: type, abstract: type) -> bool:
    # The exact-type pass is the common case and much faster than ABC isinstance checks.
    return all(type(x) is fast for x in items) or all(isinstance(x, abstract) for x in items)


def _merge_list(metadata: Mapping[str, Any]) -> list[tuple[str, str]] | None:
    items = _str_list(metadata, "tokenizer.ggml.merges", None)
    if items is None:
        return None
    pairs = [tuple(m.split(" ")) for m in items]
    bad = next((m for m, p in zip(items, pairs) if len(p) != 2 or not all(p)), None)
    if bad is not None:
        raise ModelFormatError(f"GGUF merge {bad!r} is not two pieces separated by one space")
    return pairs  # type: ignore[return-value]
