"""Qwen3-Reranker: a Qwen3 causal LM that judges a (query, document) pair by its next token
after a fixed prompt; relevance = softmax over the "no" and "yes" logits, taking "yes". Its
config.json says only Qwen3ForCausalLM, so it is recognised by its name or its README's title
(as llama.cpp's converter recognises it). Pure text: the engine computes the two logprobs."""
from __future__ import annotations

from pathlib import Path

KIND = "qwen3-yes-no"  # ModelArgs.extra["reranker"]
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
_PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
           "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
_README_BYTES = 1 << 20


def is_qwen3_reranker(model_dir: Path, model_type: str | None) -> bool:
    if model_type != "qwen3":
        return False
    if "qwen3-reranker" in model_dir.name.lower():
        return True
    readme = model_dir / "README.md"
    if readme.is_file() and readme.stat().st_size <= _README_BYTES:
        return "# qwen3-reranker" in readme.read_text(encoding="utf-8", errors="replace").lower()
    return False


def rerank_prompt(query: str, document: str, instruction: str = DEFAULT_INSTRUCTION) -> str:
    """The model card's prompt; the answer token follows it."""
    return f"{_PREFIX}<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}{_SUFFIX}"
