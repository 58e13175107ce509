"""`mlxr generate PROMPT`: one-shot completion of a prompt."""
from __future__ import annotations

import argparse

from mlxr.cli.options import add_model_options, add_sampling_options, model_path, sampling_from


def register(sub: argparse._SubParsersAction) -> dict:
    g = sub.add_parser("generate", help="one-shot completion of a prompt")
    add_model_options(g, positional=False)
    g.add_argument("prompt")
    add_sampling_options(g)
    return {"generate": cmd_generate}


def cmd_generate(ns: argparse.Namespace) -> int:
    from mlxr.llm import LLM

    params = sampling_from(ns)
    llm = LLM(model_path(ns.model), dtype=ns.dtype, device=ns.device, quantization=ns.quantization)
    out = llm.generate(ns.prompt, params)[0]
    print(out.outputs[0].text)
    return 0
