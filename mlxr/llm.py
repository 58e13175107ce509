"""The offline Python API, shaped like vLLM's: LLM(model).generate(prompts, params)."""
from __future__ import annotations

import itertools
from collections.abc import Callable
from collections.abc import Sequence as Seq

import torch

from mlxr.config import EngineConfig, ParallelConfig
from mlxr.errors import InvalidParameterError
from mlxr.engine_factory import ModelSpec, build_engine
from mlxr.types import ImagePrompt, ImagePromptIds, RequestOutput, SamplingParams
from mlxr.vision.image_files import message_images

PromptList = str | ImagePrompt | Seq[str | ImagePrompt] | Seq[Seq[int]]


class LLM:
    """Load a model (GGUF path, HF directory, or `gemma3-270m`) and generate from it."""

    def __init__(
        self,
        model: str,
        dtype: torch.dtype | str | None = None,
        device: torch.device | str | None = None,
        weight_dtype: torch.dtype | str | None = None,
        quantization: str | None = None,
        load_progress: Callable[[int, int], None] | None = None,
        mmproj: str | None = None,
        **engine_kwargs,
    ) -> None:
        """dtype sets activations and weights alike; weight_dtype stores the weights narrower.
        With neither, CPU runs fp32 activations on fp16 weights and CUDA runs bf16.
        quantization: "auto" keeps a GGUF file's quantized weights quantized; "none"
        dequantizes them; "fp8" stores linear weights as FP8 on Hopper-class GPUs.
        load_progress(done, total) is called as the weights' tensors are placed.
        mmproj: llama.cpp's mmproj GGUF (vision tower and projector) beside a GGUF model."""
        dtype = _parse_dtype(dtype) if isinstance(dtype, str) else dtype
        weight_dtype = _parse_dtype(weight_dtype) if isinstance(weight_dtype, str) else weight_dtype
        built = build_engine(ModelSpec(model, dtype, device, weight_dtype, quantization, mmproj),
                             _engine_config(engine_kwargs), progress=load_progress)
        self.loaded = built.loaded  # None when the engine core runs in its own process
        self.args = built.args
        self.tokenizer = built.tokenizer
        self.engine = built.engine
        self._ids = itertools.count()

    def load_lora(self, name: str, path: str) -> None:
        """Serve a LoRA adapter (a PEFT directory or a GGUF LoRA file) as `name` (enable_lora=True)."""
        self.engine.load_lora(name, path)

    def unload_lora(self, name: str) -> None:
        self.engine.unload_lora(name)

    def shutdown(self) -> None:
        """Stop the engine core (its process, when it has one)."""
        self.engine.shutdown()

    def generate(
        self,
        prompts: PromptList,
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        lora: str | list[str | None] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion as one batch; outputs come back in prompt order.
        lora: a loaded adapter's name (load_lora) for every prompt, or one per prompt (None: the base)."""
        prompts = _normalize_prompts(prompts)
        params = sampling_params or SamplingParams()
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        loras = lora if isinstance(lora, list) else [lora] * len(prompts)
        if len(params_list) != len(prompts) or len(loras) != len(prompts):
            raise InvalidParameterError("sampling_params", "needs one entry per prompt")
        ids = [f"gen-{next(self._ids)}" for _ in prompts]
        try:
            for rid, prompt, p, name in zip(ids, prompts, params_list, loras):
                self.engine.add_request(rid, prompt, p, lora_name=name or "")
        except Exception:
            for rid in ids:  # one bad prompt refuses the whole call and leaves nothing queued
                self.engine.abort(rid)
            raise
        finals: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished():
            for out in self.engine.step():
                if out.finished:
                    finals[out.request_id] = out
        return [finals[rid] for rid in ids]

    def chat(
        self, messages: list[dict], sampling_params: SamplingParams | None = None
    ) -> RequestOutput:
        """messages as chat templates take them; a content part {"type": "image", "image": ...}
        holds a PIL image, a file path or the file's bytes (a vision model's)."""
        vision = self.engine.args.vision
        messages, images = message_images(messages, vision.image_marker if vision is not None else None)
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        if images:
            return self.generate([ImagePrompt(prompt, images, False)], sampling_params)[0]
        ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        return self.generate([ids], sampling_params)[0]


def _normalize_prompts(prompts: PromptList) -> list[str | list[int] | ImagePrompt | ImagePromptIds]:
    if isinstance(prompts, (str, ImagePrompt)):
        return [prompts]
    out: list[str | list[int] | ImagePrompt | ImagePromptIds] = []
    for p in prompts:
        if isinstance(p, (str, ImagePrompt, ImagePromptIds)):  # ids with images made ready: kept whole
            out.append(p)
        elif isinstance(p, Seq) and all(isinstance(t, int) for t in p):
            out.append(list(p))
        else:
            raise InvalidParameterError("prompts", "each prompt must be a string, an ImagePrompt or a list of token ids")
    if not out:
        raise InvalidParameterError("prompts", "no prompts given")
    return out


def _parse_dtype(name: str) -> torch.dtype:
    table = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
             "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if name not in table:
        raise InvalidParameterError("dtype", f"unknown dtype {name!r}; use one of {sorted(table)}")
    return table[name]


PARALLEL_KEYS = ("tensor_parallel_size", "nnodes", "node_rank", "master_addr", "master_port")


def _engine_config(kwargs: dict) -> EngineConfig:
    """EngineConfig from LLM's keywords; tensor_parallel_size and the rendezvous keywords
    (vLLM's names) make its ParallelConfig."""
    parallel = {k: kwargs.pop(k) for k in PARALLEL_KEYS if k in kwargs}
    if parallel:
        kwargs["parallel"] = ParallelConfig(**parallel)
    return EngineConfig(**kwargs)
