"""GGUF vocabularies other than byte-level BPE and SentencePiece scores: SentencePiece-style BPE
with merges (tokenizer.ggml.model "gemma4", and the "sarvam-moe" pre-tokenizer) and WordPiece
("bert"), each against transformers' tokenizer of the same vocabulary."""
from __future__ import annotations

import json
from typing import Any

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, normalizers, pre_tokenizers, trainers

from mlxr.tokenizer.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")
from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer  # noqa: E402

from tokenizer_texts import CORPUS, TEXTS  # noqa: E402

NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]


@pytest.fixture(scope="module")
def spm_bpe_vocab() -> dict[str, Any]:
    """A SentencePiece-style BPE (spaces as U+2581, byte fallback) laid out as a GGUF stores it."""
    tok = HFTokenizer(models.BPE())
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    trainer = trainers.BpeTrainer(vocab_size=900, show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    trained = json.loads(tok.to_str())["model"]
    learned = sorted(trained["vocab"], key=trained["vocab"].get)
    byte_pieces = [f"<0x{b:02X}>" for b in range(256)]
    tokens = SPECIALS + byte_pieces + [t for t in learned if t not in byte_pieces]
    types = [CONTROL, CONTROL, CONTROL, UNKNOWN] + [BYTE] * 256 + [NORMAL] * len(learned)
    return {"tokens": tokens, "token_type": types,
            "merges": [" ".join(m) for m in trained["merges"]]}


def _metadata(vocab: dict[str, Any], model: str, pre: str | None = None) -> dict[str, Any]:
    meta = {
        "tokenizer.ggml.model": model, "tokenizer.ggml.tokens": vocab["tokens"],
        "tokenizer.ggml.token_type": vocab["token_type"], "tokenizer.ggml.merges": vocab["merges"],
        "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3, "tokenizer.ggml.add_bos_token": False,
    }
    return {**meta, "tokenizer.ggml.pre": pre} if pre else meta


@pytest.mark.parametrize("model,pre", [("gemma4", None), ("gpt2", "sarvam-moe"), ("gpt2", "gemma4")])
def test_sentencepiece_style_bpe_matches_transformers(
    spm_bpe_vocab: dict[str, Any], model: str, pre: str | None
) -> None:
    backend, _ = convert_gguf_tokenizer("gemma4", {"tokenizer_type": "gemma4", **spm_bpe_vocab})
    reference = transformers.PreTrainedTokenizerFast(tokenizer_object=backend)
    ours = Tokenizer.from_gguf_metadata(_metadata(spm_bpe_vocab, model, pre))
    for text in TEXTS:
        want = reference.encode(text, add_special_tokens=False)
        assert ours.encode(text) == want, text
        assert ours.decode(want) == reference.decode(want, skip_special_tokens=True), text
    assert any(spm_bpe_vocab["token_type"][i] == BYTE for t in TEXTS for i in ours.encode(t))


def _train_wordpiece(lowercase: bool) -> list[str]:
    tok = HFTokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=600, show_progress=False,
        special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
    )
    tok.train_from_iterator(CORPUS, trainer)
    vocab = tok.get_vocab()
    return sorted(vocab, key=vocab.get)


def _as_llama_cpp_writes_it(pieces: list[str]) -> tuple[list[str], list[int]]:
    # llama.cpp's converter: "##x" -> "x", a word-initial "x" -> "\u2581x", controls unchanged.
    types = [CONTROL if p.startswith("[") and p.endswith("]") else NORMAL for p in pieces]
    tokens = [p if ty == CONTROL else p[2:] if p.startswith("##") else "\u2581" + p
              for p, ty in zip(pieces, types)]
    return tokens, types


@pytest.mark.parametrize("lowercase", [True, False])
def test_wordpiece_matches_transformers_bert(lowercase: bool) -> None:
    pieces = _train_wordpiece(lowercase)
    reference = transformers.BertTokenizer(
        vocab={p: i for i, p in enumerate(pieces)}, do_lower_case=lowercase)
    tokens, types = _as_llama_cpp_writes_it(pieces)
    ours = Tokenizer.from_gguf_metadata({
        "tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.normalizer.lowercase": lowercase,
        "tokenizer.ggml.bos_token_id": pieces.index("[CLS]"),
        "tokenizer.ggml.seperator_token_id": pieces.index("[SEP]"),
        "tokenizer.ggml.unknown_token_id": pieces.index("[UNK]"),
        "tokenizer.ggml.padding_token_id": pieces.index("[PAD]"),
    })
    for text in TEXTS:
        want = reference.encode(text)
        assert ours.encode(text) == want, text
        assert ours.decode(want) == reference.decode(want, skip_special_tokens=True), text


def test_t5_unigram_matches_transformers_t5() -> None:
    import io

    spm = pytest.importorskip("sentencepiece")
    pb2 = pytest.importorskip("sentencepiece.sentencepiece_model_pb2")
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(  # T5's layout: pad 0, eos 1, unk 2, no bos; NFKC table
        sentence_iterator=iter(CORPUS), model_writer=out, vocab_size=500, model_type="unigram",
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, hard_vocab_limit=False, minloglevel=2,
    )
    proto = pb2.ModelProto()
    proto.ParseFromString(out.getvalue())
    charsmap = proto.normalizer_spec.precompiled_charsmap
    assert charsmap
    pieces = [(p.piece, p.score) for p in proto.pieces]
    reference = transformers.T5Tokenizer(vocab=pieces, _spm_precompiled_charsmap=charsmap, extra_ids=0)
    ours = Tokenizer.from_gguf_metadata({
        "tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": [p for p, _ in pieces],
        "tokenizer.ggml.scores": [s for _, s in pieces],
        "tokenizer.ggml.token_type": [int(p.type) for p in proto.pieces],
        "tokenizer.ggml.precompiled_charsmap": list(charsmap),
        "tokenizer.ggml.eos_token_id": 1, "tokenizer.ggml.unknown_token_id": 2,
        "tokenizer.ggml.padding_token_id": 0,
    })
    for text in TEXTS:
        want = reference.encode(text)  # with T5's trailing </s>
        assert ours.encode(text) == want, text
        assert ours.decode(want) == reference.decode(want, skip_special_tokens=True), text
