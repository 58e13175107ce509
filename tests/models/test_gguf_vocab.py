"""GGUF vocabularies (gpt2 byte-level BPE, llama SentencePiece) and tokenizer.model files,
checked against the tokenizers/sentencepiece originals they were written from."""
from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sentencepiece as spm
from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from mlxr.errors import ModelFormatError, UnsupportedModelError
from mlxr.tokenizer.gguf_vocab import vocab_from_gguf_metadata
from mlxr.tokenizer.tokenizer import Tokenizer

CORPUS = [
    "The quick brown fox jumps over the lazy dog. I'm sure they'll say it's fine, don't you think?",
    "Numbers like 12345, 3.14159 and 2024-01-31 appear in text; so does code: def f(x): return x**2",
    "for (int i = 0; i < n; ++i) {\n    total += values[i];\n}\n",
    "Unicode: café, naïve, Ångström, 日本語のテキスト, 中文, русский язык, العربية, 😀 emoji 🎉",
    "Whitespace   runs,\ttabs\t\tand\nnew\n\nlines\r\nmatter to tokenizers.",
] * 20

TEXTS = [
    "The lazy fox isn't quick",
    " leading space and  double   spaces",
    "DON'T SHOUT, I'LL listen",
    "x = 1234567 + 89;\n\tprint(x)",
    "日本語 中文 русский 😀🎉👍🏽 naïve",
    "line\n\n\nbreaks\r\n  indented",
    "totally unseen: ქართული ✨ 𓀀",
    "",
    "   ",
    "<|im_start|>user\nhello<|im_end|>\n<think>hmm</think>",
]


def _reference_regex() -> str:
    transformers_qwen2 = pytest.importorskip("transformers.models.qwen2.tokenization_qwen2")
    return transformers_qwen2.PRETOKENIZE_REGEX


def _train_byte_level(pre: str) -> HFTokenizer:
    tok = HFTokenizer(models.BPE())
    if pre == "qwen2":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_reference_regex()), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_tokens(["<think>", "</think>"])
    return tok


def _byte_level_metadata(tok: HFTokenizer, pre: str) -> dict[str, Any]:
    added = tok.get_added_tokens_decoder()
    n = tok.get_vocab_size(with_added_tokens=True)
    merges = json.loads(tok.to_str())["model"]["merges"]
    return {
        "general.architecture": "qwen2",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": [tok.id_to_token(i) for i in range(n)],
        "tokenizer.ggml.token_type": [
            (3 if added[i].special else 4) if i in added else 1 for i in range(n)
        ],
        "tokenizer.ggml.merges": [" ".join(m) for m in merges],
        "tokenizer.ggml.eos_token_id": 0,
        "tokenizer.ggml.eot_token_id": 2,
        "tokenizer.ggml.add_bos_token": False,
    }


@pytest.fixture(scope="module", params=["default", "qwen2"])
def byte_level(request: pytest.FixtureRequest) -> tuple[HFTokenizer, Tokenizer, dict[str, Any]]:
    original = _train_byte_level(request.param)
    metadata = _byte_level_metadata(original, request.param)
    return original, Tokenizer.from_gguf_metadata(metadata), metadata


def test_byte_level_gguf_encodes_like_the_original(byte_level: Any) -> None:
    original, ours, _ = byte_level
    for text in TEXTS + CORPUS[:5]:
        want = original.encode(text, add_special_tokens=False).ids
        assert ours.encode(text) == want, text
        assert ours.decode(want, skip_special_tokens=False) == text


def test_byte_level_specials_and_stops(byte_level: Any) -> None:
    original, ours, _ = byte_level
    im_end, think = original.token_to_id("<|im_end|>"), original.token_to_id("<think>")
    assert ours.encode("a<|im_end|>b<think>")[1] == im_end
    assert ours.encode("<think>") == [think]
    assert ours.stop_token_ids == frozenset({0, 2})
    assert im_end in ours.special_token_ids and think not in ours.special_token_ids
    assert ours.decode(ours.encode("<|im_start|>hi<think>")) == "hi<think>"


def _train_sentencepiece(tmp: Path, model_type: str, collapse: bool) -> bytes:
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=out, vocab_size=400, model_type=model_type,
        byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=collapse,
        user_defined_symbols=["<think>"], control_symbols=["<ctrl>"], hard_vocab_limit=False,
        minloglevel=2,
    )
    return out.getvalue()


def _sp_metadata(proto: bytes) -> dict[str, Any]:
    pb2 = pytest.importorskip("sentencepiece.sentencepiece_model_pb2")
    model = pb2.ModelProto()
    model.ParseFromString(proto)
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [p.piece for p in model.pieces],
        "tokenizer.ggml.scores": [p.score for p in model.pieces],
        "tokenizer.ggml.token_type": [int(p.type) for p in model.pieces],
        "tokenizer.ggml.bos_token_id": model.trainer_spec.bos_id,
        "tokenizer.ggml.eos_token_id": model.trainer_spec.eos_id,
        "tokenizer.ggml.add_space_prefix": model.normalizer_spec.add_dummy_prefix,
    }


SP_TEXTS = [t for t in TEXTS if not t.startswith("<")] + ["café  au   lait ", "\tx", " "]


@pytest.mark.parametrize("model_type,collapse", [("bpe", False), ("bpe", True), ("unigram", False)])
def test_tokenizer_model_file_encodes_like_sentencepiece(
    tmp_path: Path, model_type: str, collapse: bool
) -> None:
    proto = _train_sentencepiece(tmp_path, model_type, collapse)
    sp = spm.SentencePieceProcessor(model_proto=proto)
    (tmp_path / "tokenizer.model").write_bytes(proto)
    ours = Tokenizer.from_hf_dir(tmp_path)
    assert ours.bos_token_id == sp.bos_id() and ours.eos_token_id == sp.eos_id()
    for text in SP_TEXTS:
        assert ours.encode(text, add_special_tokens=False) == sp.encode(text), text
        assert ours.encode(text)[0] == sp.bos_id()
        assert ours.decode(sp.encode(text)) == sp.decode(sp.encode(text))
    if model_type == "bpe" and not collapse:  # the same vocab written as GGUF metadata
        from_gguf = Tokenizer.from_gguf_metadata(_sp_metadata(proto))
        assert all(from_gguf.encode(t, False) == sp.encode(t) for t in SP_TEXTS)


def test_truncated_tokenizer_model_is_a_format_error(tmp_path: Path) -> None:
    proto = _train_sentencepiece(tmp_path, "bpe", False)
    (tmp_path / "tokenizer.model").write_bytes(proto[: len(proto) // 2])
    with pytest.raises(ModelFormatError):
        Tokenizer.from_hf_dir(tmp_path)


def _tiny_llama_metadata() -> dict[str, Any]:
    tokens = ["<unk>", "<s>", "</s>", "\u2581", "a", "b", "\u2581a", "ab"]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0],
        "tokenizer.ggml.token_type": [2, 3, 3, 1, 1, 1, 1, 1],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }


def test_tiny_llama_vocab_defaults() -> None:
    tok = Tokenizer.from_gguf_metadata(_tiny_llama_metadata())
    # BOS by default, a "▁" prefix, and "▁a" (score -4) merges before "ab" (score -5)
    assert tok.encode("ab a") == [1, 6, 5, 6]
    assert tok.decode([1, 6, 5, 6]) == "ab a"


@pytest.mark.parametrize(
    "change,error",
    [
        ({"tokenizer.ggml.scores": [0.0] * 3}, ModelFormatError),
        ({"tokenizer.ggml.token_type": [1] * 7 + [9]}, ModelFormatError),
        ({"tokenizer.ggml.tokens": ["a", 3] + ["c"] * 6}, ModelFormatError),
        ({"tokenizer.ggml.tokens": "not a list"}, ModelFormatError),
        ({"tokenizer.ggml.tokens": []}, ModelFormatError),
        ({"tokenizer.ggml.bos_token_id": 8}, ModelFormatError),
        ({"tokenizer.ggml.eos_token_id": -1}, ModelFormatError),
        ({"tokenizer.ggml.eos_token_id": "2"}, ModelFormatError),
        ({"tokenizer.ggml.add_bos_token": "yes"}, ModelFormatError),
        ({"tokenizer.ggml.scores": None}, ModelFormatError),
        ({"tokenizer.ggml.merges": ["a b c"]}, ModelFormatError),
        ({"tokenizer.ggml.merges": ["x y"]}, ModelFormatError),
        ({"tokenizer.chat_template": 7}, ModelFormatError),
        ({"tokenizer.ggml.model": None}, ModelFormatError),
        ({"tokenizer.ggml.model": "rwkv"}, UnsupportedModelError),
        ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.merges": []}, None),
        ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.merges": [],
          "tokenizer.ggml.pre": "mystery"}, None),  # warns, GPT-2's split
    ],
)
def test_bad_metadata_is_rejected(change: dict[str, Any], error: type[Exception] | None) -> None:
    metadata = {**_tiny_llama_metadata(), **change}
    metadata = {k: v for k, v in metadata.items() if v is not None}
    if error is None:
        vocab_from_gguf_metadata(metadata)
        return
    with pytest.raises(error):
        vocab_from_gguf_metadata(metadata)


def test_a_huge_sentencepiece_piece_loads_in_bounded_time() -> None:
    # A 2M-character piece once made merge derivation quadratic (the load never finished).
    script = (
        "from mlxr.tokenizer.tokenizer import Tokenizer\n"
        "tokens = ['<unk>', '<s>', '</s>', '\u2581', 'a', 'b', 'ab', 'a' * 2_000_000]\n"
        "tok = Tokenizer.from_gguf_metadata({'tokenizer.ggml.model': 'llama',\n"
        "    'tokenizer.ggml.tokens': tokens, 'tokenizer.ggml.scores': [0.0] * 8,\n"
        "    'tokenizer.ggml.token_type': [2, 3, 3, 1, 1, 1, 1, 1]})\n"
        "print(tok.encode('ab', add_special_tokens=False))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[3, 6]"
