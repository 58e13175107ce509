"""Every `tokenizer.ggml.pre` name llama.cpp knows, against transformers' tokenizer of the same
vocabulary and merges cut the way that model family's Hugging Face tokenizer cuts them.

The reference is transformers' own GGUF converter where it knows the name; otherwise a
tokenizer.json whose pre-tokenizer is written as the family's repositories write it (Digits,
Punctuation, ByteLevel with its built-in regex, Split), loaded by transformers.
"""
from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from mlxr.tokenizer import gguf_pre_tokenizers as ours
from mlxr.tokenizer.tokenizer import Tokenizer
from tokenizer_texts import CORPUS, TEXTS

transformers = pytest.importorskip("transformers")
from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _train() -> HFTokenizer:
    tok = HFTokenizer(models.BPE())
    # Trained on whole lines, so that merges cross every group's cuts and tell the groups apart.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1200, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=SPECIALS,
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_tokens(["<think>", "</think>"])
    return tok


@pytest.fixture(scope="module")
def trained() -> tuple[HFTokenizer, dict[str, Any]]:
    tok = _train()
    n = tok.get_vocab_size(with_added_tokens=True)
    added = tok.get_added_tokens_decoder()
    vocab = {
        "tokens": [tok.id_to_token(i) for i in range(n)],
        "token_type": [(3 if added[i].special else 4) if i in added else 1 for i in range(n)],
        "merges": [" ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]],
    }
    return tok, vocab


def _split(regex: str) -> dict[str, Any]:
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


def _byte_level(use_regex: bool) -> dict[str, Any]:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex}


def _digits(individual: bool) -> dict[str, Any]:
    return {"type": "Digits", "individual_digits": individual}


def _seq(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"type": "Sequence", "pretokenizers": list(steps)}


def _splits(*regexes: str) -> dict[str, Any]:
    return _seq(*map(_split, regexes), _byte_level(False))


_BLOOM_ORIGINAL = " ?[^(\\s|[.,!?…。，、।۔،])]+"  # as bloom's tokenizer.json writes it
_GPT4O_FAMILY = "gpt-4o"  # transformers' converter knows this one

# Reference per llama.cpp group: transformers' converter by a name it knows (a str), or the
# family's tokenizer.json pre-tokenizer (a dict), and whether its BPE ignores merges.
GROUPS: list[tuple[tuple[str, ...], str | dict[str, Any], bool]] = [
    (("default", "gpt2", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es",
      "jina-v2-de", "a.x-4.0", "mellum", "modern-bert", "jina-v1-en", "jina-v2-code",
      "roberta-bpe", "exaone4", "mpt", "olmo", "jais", "trillion", "granite-docling", "mystery"),
     "gpt2", False),
    (("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"),
     _seq(_digits(True), _byte_level(True)), False),
    (("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
      "jina-v5-nano", "glm4", "glm5", "dbrx", "smaug-bpe", "chatglm-bpe"), "llama3", False),
    (("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan",
      "solar-open", "grok-2"), "qwen2", False),
    (("qwen35",), "qwen35", False),
    (("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2", "granite-embed-multi-97m"),
     _GPT4O_FAMILY, False),
    (("tekken",), "tekken", False),
    (("jais-2",), _splits(ours.JAIS2), False),
    (("tiny_aya", "cohere2moe"), _splits(r"\d{1,3}(?=(?:\d{3})*\b)", ours.GPT4O), False),
    (("kimi-k2",), _splits(ours.KIMI_K2), False),
    (("deepseek-llm",), _seq(
        _split("[\r\n]"), _split(f"\\s?[{ours._DEEPSEEK_LLM_LETTERS}]+"),
        _split("\\s?[!-/:-~！-／：-～‘-‟\u3000-。]+"), _split("\\s+$"), _split(ours._CJK_HANGUL),
        _digits(False), _byte_level(False)), False),
    (("deepseek-coder",), _seq(
        _split("[\r\n]"), _split("\\s?\\p{L}+"), _split("\\s?\\p{P}+"), _split(ours._CJK_HANGUL),
        _digits(True), _byte_level(False)), False),
    (("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"), _splits(*ours._DEEPSEEK3.regexes), False),
    (("spark2_5",), _splits(*ours.PRE_TOKENIZERS["spark2_5"].regexes), False),
    (("youtu",), _splits(*ours.PRE_TOKENIZERS["youtu"].regexes), True),
    (("falcon",), _seq(
        {"type": "Punctuation", "behavior": "Contiguous"}, _byte_level(True), _digits(False),
        _split("[0-9][0-9][0-9]")), False),
    (("poro-chat", "bloom", "gpt3-finnish"), _splits(_BLOOM_ORIGINAL), False),
    (("viking",), _seq(_split(_BLOOM_ORIGINAL), _digits(True), _byte_level(False)), False),
    (("chameleon",), _seq(
        _split("<sentinel:[0-9]+>"), _split("(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z"),
        _split("([\\t\\n]|    |  )"), _digits(True), _split("[\\p{P}!-/:-@\\[-`{-~]"),
        _byte_level(True)), False),
    (("superbpe",), _splits(r"\p{N}+", r"(?=(\d{3})+(?!\d))"), False),
    (("bailingmoe", "bailingmoe2", "llada-moe"), _splits(*ours.PRE_TOKENIZERS["bailingmoe"].regexes),
     False),
    (("seed-coder",), _splits(*ours.PRE_TOKENIZERS["seed-coder"].regexes), False),
    (("ufakzeka",), _splits(*ours.PRE_TOKENIZERS["ufakzeka"].regexes), False),
    (("afmoe",), _splits(*ours.PRE_TOKENIZERS["afmoe"].regexes), False),
    (("laguna",), _splits(r"[^\n]+|[\n]+", ours.QWEN2), False),
    (("exaone-moe",), _splits(*ours.PRE_TOKENIZERS["exaone-moe"].regexes), False),
    (("minicpm5",), _splits(*ours.PRE_TOKENIZERS["minicpm5"].regexes), True),
]


def _reference(trained_tok: HFTokenizer, vocab: dict[str, Any], ref: str | dict[str, Any],
               ignore_merges: bool) -> Any:
    if isinstance(ref, str):
        backend, _ = convert_gguf_tokenizer(
            "llama", {"tokenizer_type": "gpt2", "pre_tokenizer_type": ref, **vocab})
    else:
        spec = json.loads(trained_tok.to_str())
        spec["pre_tokenizer"] = ref
        spec["model"]["ignore_merges"] = ignore_merges
        backend = HFTokenizer.from_str(json.dumps(spec))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend)


def _ours(vocab: dict[str, Any], pre: str) -> Tokenizer:
    return Tokenizer.from_gguf_metadata({
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": vocab["tokens"], "tokenizer.ggml.token_type": vocab["token_type"],
        "tokenizer.ggml.merges": vocab["merges"], "tokenizer.ggml.add_bos_token": False,
    })


def test_every_llama_cpp_name_is_in_a_tested_group() -> None:
    tested = {name for names, _, _ in GROUPS for name in names}
    spm_style = {"gemma4", "granite-embed-multi-311m", "sarvam-moe", "whitespace"}
    assert set(ours.PRE_TOKENIZERS) - spm_style <= tested
    assert len(TEXTS) >= 50


@pytest.mark.parametrize("names,ref,ignore_merges", GROUPS, ids=[g[0][0] for g in GROUPS])
def test_ids_match_transformers(trained: Any, names: tuple[str, ...], ref: Any,
                                ignore_merges: bool) -> None:
    trained_tok, vocab = trained
    reference = _reference(trained_tok, vocab, ref, ignore_merges)
    want = [reference.encode(t, add_special_tokens=False) for t in TEXTS]
    for name in names:
        tok = _ours(vocab, name)
        got = [tok.encode(t) for t in TEXTS]
        bad = [(t, g, w) for t, g, w in zip(TEXTS, got, want) if g != w]
        assert not bad, f"{name}: {len(bad)} of {len(TEXTS)} differ, first {bad[0]}"
        assert all(tok.decode(w, skip_special_tokens=False) == t for t, w in zip(TEXTS, want))


def test_groups_cut_text_differently(trained: Any) -> None:
    # The texts must tell the groups apart, or a name mapped to the wrong group could pass.
    _, vocab = trained
    cuts: dict[Any, list[str]] = {}
    for names, _, _ in GROUPS:
        split = _ours(vocab, names[0])._backend.pre_tokenizer.pre_tokenize_str
        cuts.setdefault(tuple(tuple(p for p, _ in split(t)) for t in TEXTS), []).append(names[0])
    same = sorted(sorted(g) for g in cuts.values() if len(g) > 1)
    # minicpm5 cuts digits in threes before a llama3-like regex; bailingmoe's possessive
    # quantifiers never give anything back in qwen2's regex: no text cuts these pairs apart.
    assert same == [["bailingmoe", "qwen2"], ["llama3", "minicpm5"]]


def test_unknown_name_warns_and_uses_gpt2_split(trained: Any, caplog: Any) -> None:
    _, vocab = trained
    with caplog.at_level(logging.WARNING):
        tok = _ours(vocab, "brand-new-model")
    assert "'brand-new-model'" in caplog.text
    assert tok.encode("Hello 12345 world") == _ours(vocab, "gpt2").encode("Hello 12345 world")
