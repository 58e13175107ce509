"""The reference the prompt-logprobs tests (engine and server) compare with: HF transformers'
log-softmax over a fixed prompt, on the same weights."""
from __future__ import annotations

import torch

from model_fixtures import fixture_model

PROMPT = [1, 7, 300, 45, 99, 12, 250, 3, 77, 180, 31, 64, 400, 9, 11, 222, 5, 88, 123, 301, 17, 42]


def hf_prompt_logprobs(name: str, ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(fixture_model(name).hf_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)
