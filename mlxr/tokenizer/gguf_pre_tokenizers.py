"""llama.cpp's pre-tokenizer names (`tokenizer.ggml.pre`) as `tokenizers` pre-tokenizers.

A name stands for a list of regexes applied in turn, each cutting the pieces so far into its
matches and the text between them (`Split(..., "isolated")`), as llama.cpp applies them; the
pieces are then spelled in GPT-2's byte alphabet. The names and lists are llama.cpp's
(src/llama-vocab.cpp). Where llama.cpp rewrote a model's regex for its own engine
(case-insensitive groups spelled out, lookaheads for Unicode classes, no possessive
quantifiers), the model's original from its tokenizer.json is used: `tokenizers` runs it as the
model's Hugging Face tokenizer does, and that tokenizer is the reference the tests compare with.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from tokenizers import Regex, pre_tokenizers

log = logging.getLogger(__name__)

_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_SPACES = r"\s*[\r\n]+|\s+(?!\S)|\s+"

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (
    rf"{_CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}{{1,3}}"
    rf"| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|{_SPACES}"
)
QWEN2 = rf"{_CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|{_SPACES}"
QWEN35 = (
    rf"{_CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?[\p{{L}}\p{{M}}]+|\p{{N}}"
    rf"| ?[^\s\p{{L}}\p{{M}}\p{{N}}]+[\r\n]*|{_SPACES}"
)
JAIS2 = (
    rf"{_CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*"
    r"|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)"
    r"|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}"
)
GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
    rf"|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]*|{_SPACES}"
)
TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    rf"|\p{{N}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]*|{_SPACES}"
)
_NOT_HAN = r"&&[^\p{Han}]"
KIMI_K2 = (
    rf"[\p{{Han}}]+"
    rf"|[^\r\n\p{{L}}\p{{N}}]?[\p{{Lu}}\p{{Lt}}\p{{Lm}}\p{{Lo}}\p{{M}}{_NOT_HAN}]*"
    rf"[\p{{Ll}}\p{{Lm}}\p{{Lo}}\p{{M}}{_NOT_HAN}]+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?[\p{{Lu}}\p{{Lt}}\p{{Lm}}\p{{Lo}}\p{{M}}{_NOT_HAN}]+"
    rf"[\p{{Ll}}\p{{Lm}}\p{{Lo}}\p{{M}}{_NOT_HAN}]*{_CONTRACTIONS}?"
    rf"|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|{_SPACES}"
)
_DEEPSEEK_WORDS = (
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
)
_CJK_KANA = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
_CJK_HANGUL = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_DEEPSEEK_LLM_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a"
    "\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-"
    "\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-"
    "\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-"
    "\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-"
    "\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-"
    "\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-"
    "\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-"
    "\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-"
    "\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-"
    "\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-"
    "\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943"
)
_BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"
_AFMOE_SCRIPTS = (
    "[\u4e00-\u9fff\u3400-\u4dbf\u8c48-\ufaff\u3040-\u309f\u30a0-\u30ff\uff65-\uff9f"
    "\u2f00-\u2fdf\u0e40-\u0e7f\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\uaa60-\uaa7f"
    "\ua9e0-\ua9ff\uac00-\ud7af\u1100-\u11ff]+"
)


@dataclass(frozen=True)
class PreTokenizerSpec:
    """How one `tokenizer.ggml.pre` name cuts text before the merges run."""

    regexes: tuple[str, ...]
    # Applied to the byte-alphabet spelling: Falcon's tokenizer.json cuts digits after ByteLevel.
    after_bytes: tuple[str, ...] = ()
    byte_level: bool = True  # False: merges run on the raw UTF-8 text (SentencePiece-style BPE)
    # The word is looked up whole before merging (tokenizer.json "ignore_merges": Llama 3 and kin)
    ignore_merges: bool = False


_GPT2 = PreTokenizerSpec((GPT2,))
_STARCODER = PreTokenizerSpec((r"\p{N}", GPT2))
_LLAMA3 = PreTokenizerSpec((LLAMA3,))
_QWEN2 = PreTokenizerSpec((QWEN2,))
_GPT4O = PreTokenizerSpec((GPT4O,))
_DEEPSEEK3 = PreTokenizerSpec(
    (r"\p{N}{1,3}", _CJK_KANA, rf"{_DEEPSEEK_WORDS}| ?[\p{{P}}\p{{S}}]+[\r\n]*|{_SPACES}")
)
_BLOOM_SPEC = PreTokenizerSpec((_BLOOM,))
_SPM_STYLE = PreTokenizerSpec((), byte_level=False)


def _ignoring_merges(spec: PreTokenizerSpec) -> PreTokenizerSpec:
    return dataclasses.replace(spec, ignore_merges=True)


# Every name llama.cpp accepts for a BPE vocabulary, grouped as it groups them.
PRE_TOKENIZERS: dict[str, PreTokenizerSpec] = {
    **dict.fromkeys(
        ("default", "gpt2", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es",
         "jina-v2-de", "a.x-4.0", "mellum", "modern-bert", "jina-v1-en", "jina-v2-code",
         "roberta-bpe", "exaone4", "mpt", "olmo", "jais", "trillion", "granite-docling"),
        _GPT2),
    **dict.fromkeys(
        ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b",
         "mellum2"),
        _STARCODER),
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
         "lfm2", "jina-v5-nano", "glm4", "glm5"),
        _ignoring_merges(_LLAMA3)),
    **dict.fromkeys(("dbrx", "smaug-bpe", "chatglm-bpe"), _LLAMA3),
    "jais-2": PreTokenizerSpec((JAIS2,)),
    **dict.fromkeys(
        ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan",
         "solar-open", "grok-2"),
        _QWEN2),
    "qwen35": PreTokenizerSpec((QWEN35,)),
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O),
    "granite-embed-multi-97m": _ignoring_merges(_GPT4O),
    "tekken": PreTokenizerSpec((TEKKEN,), ignore_merges=True),
    **dict.fromkeys(
        ("tiny_aya", "cohere2moe"), PreTokenizerSpec((r"\d{1,3}(?=(?:\d{3})*\b)", GPT4O))),
    "kimi-k2": PreTokenizerSpec((KIMI_K2,)),
    "deepseek-llm": PreTokenizerSpec((
        r"[\r\n]", rf"\s?[{_DEEPSEEK_LLM_LETTERS}]+", "\\s?[!-/:-~！-／：-～‘-‟\u3000-。]+", r"\s+$",
        _CJK_HANGUL, r"\p{N}+",
    )),
    "deepseek-coder": PreTokenizerSpec(
        (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK_HANGUL, r"\p{N}")),
    **dict.fromkeys(("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"), _DEEPSEEK3),
    "spark2_5": PreTokenizerSpec((
        r"\p{N}{1,3}", _CJK_KANA,
        rf"{_DEEPSEEK_WORDS}| ?[\p{{P}}\p{{S}}]+|[\r\n]|\s+(?!\S)|\s+", r"\p{N}",
    )),
    "youtu": PreTokenizerSpec((
        "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|" + _CJK_KANA,
        rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
        rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
        rf"|\p{{N}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]*|{_SPACES}",
    ), ignore_merges=True),
    # Falcon's tokenizer.json: Punctuation, ByteLevel, Digits, then runs of three digits.
    "falcon": PreTokenizerSpec(
        (r"[\p{P}$+<=>^`|~]+", GPT2), after_bytes=(r"\p{N}+", "[0-9][0-9][0-9]")),
    **dict.fromkeys(("poro-chat", "bloom", "gpt3-finnish"), _BLOOM_SPEC),
    "viking": PreTokenizerSpec((_BLOOM, r"\p{N}")),
    "chameleon": PreTokenizerSpec((
        "<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )",
        r"\p{N}", r"[\p{P}!-/:-@\[-`{-~]", GPT2,
    )),
    "superbpe": PreTokenizerSpec((r"\p{N}+", r"(?=(\d{3})+(?!\d))")),
    **dict.fromkeys(("bailingmoe", "bailingmoe2", "llada-moe"), PreTokenizerSpec((
        r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*"
        r"|\s*[\r\n]|\s+(?!\S)|\s+",
    ))),
    "seed-coder": PreTokenizerSpec((
        rf"{_CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}{{1}}| ?[^\s\p{{L}}\p{{N}}\r\n]+"
        rf"|{_SPACES}",
    )),
    "ufakzeka": PreTokenizerSpec(
        (rf"[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|{_SPACES}",)),
    # AFMoE's digit rule (a run of digits cut into threes from the right) written as a regex.
    "afmoe": PreTokenizerSpec((
        r"\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))", _AFMOE_SCRIPTS,
        rf"{_DEEPSEEK_WORDS}| ?[\p{{P}}\p{{S}}]+[\r\n]*|{_SPACES}",
    )),
    "laguna": PreTokenizerSpec((r"[^\n]+|[\n]+", QWEN2)),
    "exaone-moe": PreTokenizerSpec((
        rf"{_CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?(?:\p{{L}}\p{{M}}*(?: \p{{L}}\p{{M}}*)*)+|\p{{N}}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",
    )),
    "minicpm5": PreTokenizerSpec((
        r"\p{N}{1,3}",
        rf"{_CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}+| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*"
        rf"|{_SPACES}",
    ), ignore_merges=True),
    **dict.fromkeys(("gemma4", "granite-embed-multi-311m", "sarvam-moe"), _SPM_STYLE),
    "whitespace": PreTokenizerSpec((r"\S+",), byte_level=False),
}


def pre_tokenizer_spec(name: str | None) -> PreTokenizerSpec:
    """The spec for a `tokenizer.ggml.pre` value; an unknown name gets GPT-2's split."""
    if name is None:
        log.warning("the GGUF file names no pre-tokenizer; using the default (GPT-2) split")
        return _GPT2
    spec = PRE_TOKENIZERS.get(name)
    if spec is None:
        log.warning("GGUF pre-tokenizer %r is unknown; using the default (GPT-2) split, "
                    "so the tokenization may differ from the model's own", name)
        return _GPT2
    return spec


def build_pre_tokenizer(spec: PreTokenizerSpec) -> pre_tokenizers.PreTokenizer | None:
    """The `tokenizers` pre-tokenizer for a byte-level spec (ByteLevel included)."""
    steps: list[pre_tokenizers.PreTokenizer] = [_split(r) for r in spec.regexes]
    if spec.byte_level:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    steps += [_split(r) for r in spec.after_bytes]
    if not steps:
        return None
    return steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)


def _split(regex: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Split(Regex(regex), behavior="isolated")
