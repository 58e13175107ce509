"""A small deterministic byte-level BPE tokenizer for fixture models, with chat templates.

Trained with the `tokenizers` library on built-in text; padded with `<unusedN>` tokens so
the vocabulary has exactly the model's vocab_size entries.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

_TEXT = """\
The quick brown fox jumps over the lazy dog. A small model reads a short prompt and
writes a few words back; the engine keeps every token it has seen in a paged cache.
Once upon a time there was a little robot who liked to count the stars at night.
It counted one, two, three, four, five, six, seven, eight, nine and ten, then it slept.
Hello! How are you today? I am fine, thank you. What is the capital of France?
The capital of France is Paris. Water boils at 100 degrees Celsius at sea level.
Numbers like 3.14159, 2718, 42 and 1,000,000 appear in text, as do dates: 2024-05-17.
def add(a, b):\n    return a + b\nprint(add(2, 3))  # prints 5
Questions, answers, lists and tables: name | value | unit; speed | 12 | m/s.
Unicode text matters too: café, naïve, résumé, Grüße aus München, ¿Qué tal?
日本語のテキスト、中文文本，한국어 텍스트, Привет, мир! Γειά σου κόσμε. שלום עולם.
Symbols and emoji: ∑ ∫ π ≈ √2 → ∞, €5, £3, ¥100, 🙂 🚀 🌍 ✨ — “quotes” and ‘apostrophes’.
"""
_SYLLABLES = (
    "ka ri to ne mu sa lo vi de pa chi ron tel mar quo zen fi lu bra sto gen "
    "al ex or in ta ve po shi ku wa nor dal pen rin cas tu mo ly gra"
).split()


@dataclass(frozen=True)
class TokenizerSpec:
    """Special tokens (ids 0.. in this order), which of them are bos/eos, and the chat style."""

    specials: tuple[str, ...]
    bos: str | None
    eos: tuple[str, ...]
    pad: str | None
    unk: str | None
    chat: str  # "zephyr" | "chatml" | "gemma"
    add_bos: bool
    words: tuple[str, ...] = ()  # ordinary (not special) tokens added after training


LLAMA = TokenizerSpec(("<unk>", "<s>", "</s>"), "<s>", ("</s>",), None, "<unk>", "zephyr", True)
QWEN2 = TokenizerSpec(("<|endoftext|>", "<|im_start|>", "<|im_end|>"), None,
                      ("<|im_end|>", "<|endoftext|>"), "<|endoftext|>", None, "chatml", False)
GEMMA = TokenizerSpec(("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"),
                      "<bos>", ("<eos>", "<end_of_turn>"), "<pad>", "<unk>", "gemma", True)
# Gemma 3's image tokens after the text model's specials (ids 6, 7, 8).
GEMMA_VLM = TokenizerSpec(GEMMA.specials + ("<start_of_image>", "<end_of_image>", "<image_soft_token>"),
                          "<bos>", ("<eos>", "<end_of_turn>"), "<pad>", "<unk>", "gemma_vlm", True)

# LLaVA: Llama's specials and its <image> placeholder (id 3).
LLAVA = TokenizerSpec(("<unk>", "<s>", "</s>", "<image>"), "<s>", ("</s>",), None, "<unk>", "zephyr", True)
# Idefics3 / SmolVLM: LLaVA's, then the tile layout's tokens as their processor writes them.
IDEFICS3 = TokenizerSpec(LLAVA.specials + ("<fake_token_around_image>", "<global-img>", "<end_of_utterance>")
                         + tuple(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)),
                         "<s>", ("</s>", "<end_of_utterance>"), None, "<unk>", "zephyr", True,
                         words=("\n\n",))  # a token of SmolVLM's vocabulary that libmtmd's tile layout looks up

# Qwen2.5-VL: Qwen2's specials and its image tokens (ids 3, 4, 5).
QWEN2_VL = TokenizerSpec(QWEN2.specials + ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>"), None,
                         ("<|im_end|>", "<|endoftext|>"), "<|endoftext|>", None, "chatml", False)

# gpt-oss's specials (in the fixture's own ids 0..7); its replies stop at <|return|> or <|call|>.
HARMONY = TokenizerSpec(("<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
                         "<|return|>", "<|call|>"), None, ("<|return|>", "<|call|>", "<|endoftext|>"),
                        "<|endoftext|>", None, "harmony", False)

# The harmony format's rendering, as the fixture's own template: the system message naming the
# reasoning level and the channels, the tools as a `namespace functions` developer message, past
# calls to `functions.NAME` on the commentary channel, their results from `functions.NAME`, past
# answers on the final channel, and the reply opened as `<|start|>assistant`.
_HARMONY_TEMPLATE = (
    "{%- set ns = namespace(tool='') -%}"
    "<|start|>system<|message|>Reasoning: {{ reasoning_effort if reasoning_effort is defined else 'medium' }}\n"
    "# Valid channels: analysis, commentary, final.<|end|>"
    "{%- if tools -%}<|start|>developer<|message|># Tools\nnamespace functions {\n"
    "{% for t in tools %}{% set f = t.function if t.function is defined else t %}"
    "type {{ f.name }} = (_: {{ f.parameters | tojson }}) => any;\n{% endfor -%}"
    "} // namespace functions<|end|>{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role in ('system', 'developer') -%}<|start|>developer<|message|>{{ m.content }}<|end|>"
    "{%- elif m.role == 'user' -%}<|start|>user<|message|>{{ m.content }}<|end|>"
    "{%- elif m.role == 'assistant' and m.tool_calls -%}"
    "{%- for c in m.tool_calls %}{% set f = c.function if c.function is defined else c %}{% set ns.tool = f.name -%}"
    "<|start|>assistant to=functions.{{ f.name }}<|channel|>commentary json<|message|>"
    "{{ f.arguments if f.arguments is string else f.arguments | tojson }}<|call|>{%- endfor -%}"
    "{%- elif m.role == 'assistant' -%}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>"
    "{%- elif m.role == 'tool' -%}<|start|>functions.{{ ns.tool }} to=assistant<|channel|>commentary<|message|>"
    "{{ m.content }}<|end|>"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}"
)

CHAT_TEMPLATES = {
    "harmony": _HARMONY_TEMPLATE,
    "zephyr": (
        "{{ bos_token }}{% for message in messages %}"
        "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
    ),
    "chatml": (
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    ),
    "gemma": (
        "{{ bos_token }}{% for message in messages %}"
        "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
        "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
    ),
    # As "gemma", with content parts: an image part is its marker, as Gemma 3's own template writes it.
    "gemma_vlm": (
        "{{ bos_token }}{% for message in messages %}"
        "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
        "{{ '<start_of_turn>' + role + '\\n' }}"
        "{% if message['content'] is string %}{{ message['content'] | trim }}{% else %}"
        "{% for part in message['content'] %}{% if part['type'] == 'image' %}{{ '<start_of_image>' }}"
        "{% elif part['type'] == 'text' %}{{ part['text'] | trim }}{% endif %}{% endfor %}{% endif %}"
        "{{ '<end_of_turn>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
    ),
}


def _corpus(vocab_size: int) -> list[str]:
    lines = _TEXT.splitlines() * 4
    if vocab_size > 1000:  # the built-in text cannot yield that many merges: add pseudo-words
        rng = np.random.default_rng(1234)
        n_words = min(40 * vocab_size, 2_000_000)
        picks = rng.integers(0, len(_SYLLABLES), size=(n_words, 3))
        lengths = rng.integers(1, 4, size=n_words)
        words = ["".join(_SYLLABLES[j] for j in row[:n]) for row, n in zip(picks, lengths)]
        lines += [" ".join(words[i : i + 16]) for i in range(0, len(words), 16)]
    return lines


def build_tokenizer(spec: TokenizerSpec, vocab_size: int) -> Tokenizer:
    """Train the byte-level BPE and pad it to exactly `vocab_size` tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(spec.words),
        special_tokens=list(spec.specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=1,
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(vocab_size), trainer)
    tok.add_tokens([AddedToken(w, normalized=False, special=False) for w in spec.words])
    missing = vocab_size - tok.get_vocab_size()
    if missing < 0:
        raise ValueError(f"trained {tok.get_vocab_size()} tokens, more than {vocab_size}")
    tok.add_special_tokens([f"<unused{i}>" for i in range(missing)])
    if spec.add_bos and spec.bos:
        bos_id = tok.token_to_id(spec.bos)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{spec.bos} $A", pair=f"{spec.bos} $A {spec.bos} $B", special_tokens=[(spec.bos, bos_id)]
        )
    return tok


def token_id(tok: Tokenizer, text: str | None) -> int | None:
    return None if text is None else tok.token_to_id(text)


def hf_tokenizer_files(tok: Tokenizer, spec: TokenizerSpec, max_len: int) -> dict[str, str]:
    """File name -> content of the HF tokenizer files."""
    special_map = {k: v for k, v in
                   {"bos_token": spec.bos, "eos_token": spec.eos[0], "pad_token": spec.pad, "unk_token": spec.unk}.items()
                   if v is not None}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special_map,
        "add_bos_token": spec.add_bos,
        "add_eos_token": False,
        "model_max_length": max_len,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATES[spec.chat],
    }
    return {
        "tokenizer.json": tok.to_str(pretty=True),
        "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False),
        "special_tokens_map.json": json.dumps(special_map, indent=2),
    }


def gguf_vocab(tok: Tokenizer, spec: TokenizerSpec) -> tuple[list[str], list[int], list[str]]:
    """(tokens by id, llama.cpp token types, merges as "a b") for tokenizer.ggml.*."""
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = [""] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    control = set(spec.specials)
    # llama.cpp token types: 1 normal, 3 control, 5 unused
    types = [3 if t in control else 5 if t.startswith("<unused") else 1 for t in tokens]
    model = json.loads(tok.to_str())["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, types, merges
