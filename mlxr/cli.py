"""Command line: `mlxr generate`, `mlxr run` (interactive chat)."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from mlxr.errors import MLXRError

# Modules that add subcommands: each has register(subparsers) -> {command: handler(ns) -> int}.
EXTRA_COMMANDS = ("mlxr.cli_serve", "mlxr.cli_registry", "mlxr.cli_bench", "mlxr.cli_quantize")
HANDLERS: dict = {}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mlxr", description="Local-first LLM inference engine")
    p.add_argument("--log-level", default="WARNING")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="one-shot completion of a prompt")
    _model_options(g, positional=False)
    g.add_argument("prompt")
    _sampling_options(g)
    r = sub.add_parser("run", help="interactive chat in the terminal")
    _model_options(r, positional=True)
    r.add_argument("--system", default=None, help="system prompt")
    _sampling_options(r, default_max=512)
    for module in EXTRA_COMMANDS:
        HANDLERS.update(importlib.import_module(module).register(sub))
    return p


def _model_options(p: argparse.ArgumentParser, positional: bool) -> None:
    if positional:
        p.add_argument("model", nargs="?", default="smollm2:135m")  # the chat model
    else:
        p.add_argument("--model", "-m", default="gemma3-270m")
    p.add_argument("--device", default=None, help="cpu or cuda (default cpu)")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16")
    p.add_argument("--quantization", "-q", default=None, help="auto (keep quantized GGUF weights) | none | fp8 (Hopper GPUs)")


def _sampling_options(p: argparse.ArgumentParser, default_max: int = 128) -> None:
    p.add_argument("--max-tokens", type=int, default=default_max)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)


def sampling_from(ns: argparse.Namespace):
    from mlxr.types import SamplingParams

    return SamplingParams(
        max_tokens=ns.max_tokens,
        temperature=ns.temperature,
        top_k=ns.top_k,
        top_p=ns.top_p,
        seed=ns.seed,
    )


def model_path(ref: str) -> str:
    """A registry name (`mlxr list`) becomes its path; paths and the bundled name pass through."""
    from pathlib import Path

    from mlxr.cli_registry import home_dir
    from mlxr.errors import ModelNotFoundError
    from mlxr.loader.resolve import BUNDLED_MODELS
    from mlxr.registry import Registry

    if ref in BUNDLED_MODELS or Path(ref).expanduser().exists():
        return ref
    try:
        return str(Registry(home_dir(None)).resolve(ref).path)
    except ModelNotFoundError:
        return ref  # the loader explains what it looked for


def cmd_generate(ns: argparse.Namespace) -> int:
    from mlxr.llm import LLM

    params = sampling_from(ns)
    llm = LLM(model_path(ns.model), dtype=ns.dtype, device=ns.device, quantization=ns.quantization)
    out = llm.generate(ns.prompt, params)[0]
    print(out.outputs[0].text)
    return 0


def cmd_run(ns: argparse.Namespace) -> int:
    from mlxr.chat_repl import chat_loop

    return chat_loop(model_path(ns.model), sampling_from(ns), ns.system, ns.dtype, ns.device, ns.quantization)


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    logging.basicConfig(level=ns.log_level.upper(), stream=sys.stderr)
    try:
        return {"generate": cmd_generate, "run": cmd_run, **HANDLERS}[ns.command](ns)
    except MLXRError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
