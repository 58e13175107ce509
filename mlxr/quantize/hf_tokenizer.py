"""An HF directory's tokenizer.json -> GGUF `tokenizer.*` metadata, for byte-level BPE
vocabularies (GPT-2, Llama 3, Qwen2 style): `tokenizer.ggml.model = "gpt2"`.

Special-token ids, add_bos/add_eos, merges and the chat template come from gguf-py's
SpecialVocab, as in convert_hf_to_gguf. SentencePiece-style tokenizer.json files (Metaspace
pre-tokenizer or byte fallback: Llama 2, Gemma) and other pre-tokenizer regexes are refused.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf

from mlxr.errors import ModelFormatError, UnsupportedModelError
from mlxr.formats.json_file import read_json_object

_MAX_TOKENIZER_BYTES = 256 << 20
# Split regexes of known pre-tokenizers, by the tokenizer.ggml.pre name llama.cpp gives them.
_SPLITS = {
    "llama-bpe": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
    "qwen2": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
}
_NORMALIZERS = (None, "NFC")


def add_hf_tokenizer(w: gguf.GGUFWriter, hf_dir: Path, vocab_size: int) -> None:
    """Write the `tokenizer.*` keys for the model's `vocab_size` token ids."""
    tok = _load(hf_dir / "tokenizer.json")
    model = tok.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        raise UnsupportedModelError(
            "only byte-level BPE tokenizers (GPT-2/Llama 3/Qwen2 style) can be converted from a "
            "Hugging Face directory; quantize a GGUF of this model instead")
    tokens, types = _vocab(tok, vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(_pre_name(tok))
    w.add_token_list(tokens)
    w.add_token_types(types)
    gguf.SpecialVocab(hf_dir, load_merges=True, n_vocab=len(tokens)).add_to_gguf(w, quiet=True)


def _load(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UnsupportedModelError(f"{path.parent} has no tokenizer.json (needed for the GGUF vocabulary)")
    return read_json_object(path, _MAX_TOKENIZER_BYTES)


def _vocab(tok: dict[str, Any], vocab_size: int) -> tuple[list[str], list[int]]:
    """Tokens by id and their llama.cpp types; ids the tokenizer lacks become [PADi] (unused)."""
    vocab = tok["model"].get("vocab")
    if not isinstance(vocab, dict):
        raise ModelFormatError("tokenizer.json model.vocab is not an object")
    tokens: dict[int, str] = {i: t for t, i in vocab.items() if isinstance(i, int)}
    types = {i: gguf.TokenType.NORMAL for i in tokens}
    for added in tok.get("added_tokens") or []:
        i, text = added.get("id"), added.get("content")
        if isinstance(i, int) and isinstance(text, str):
            tokens[i] = text
            types[i] = gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED
    top = max(tokens, default=-1)
    if top >= vocab_size or min(tokens, default=0) < 0:
        raise ModelFormatError(f"tokenizer.json has token id {top}, outside the model's vocab_size {vocab_size}")
    ids = range(vocab_size)
    return ([tokens.get(i, f"[PAD{i}]") for i in ids],
            [int(types.get(i, gguf.TokenType.UNUSED)) for i in ids])


def _pre_name(tok: dict[str, Any]) -> str:
    normalizer = (tok.get("normalizer") or {}).get("type")
    if normalizer not in _NORMALIZERS:
        raise UnsupportedModelError(f"tokenizer.json normalizer {normalizer!r} is not supported")
    steps = _flatten(tok.get("pre_tokenizer"))
    kinds = [s.get("type") for s in steps]
    if "ByteLevel" not in kinds:
        raise UnsupportedModelError(f"tokenizer.json pre-tokenizer {kinds} is not byte-level BPE")
    splits = [s.get("pattern", {}).get("Regex") for s in steps if s.get("type") == "Split"]
    if not splits and steps[kinds.index("ByteLevel")].get("use_regex", True):
        return "gpt-2"
    for name, regex in _SPLITS.items():
        if splits == [regex]:
            return name
    raise UnsupportedModelError(f"tokenizer.json pre-tokenizer split {splits!r} is not one llama.cpp knows "
                                f"from us (supported: gpt-2, {', '.join(_SPLITS)})")


def _flatten(pre: Any) -> list[dict[str, Any]]:
    if not isinstance(pre, dict):
        return []
    if pre.get("type") == "Sequence":
        return [s for p in pre.get("pretokenizers") or [] for s in _flatten(p)]
    return [pre]
