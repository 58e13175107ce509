"""`mlxr generate PROMPT`: one-shot completion of a prompt, printed as the tokens come."""
from __future__ import annotations

import argparse
import sys

from mlxr.cli.options import add_model_options, add_sampling_options, model_path, sampling_from
from mlxr.distributed.launch import add_parallel_options, parallel_from, run_node


def register(sub: argparse._SubParsersAction) -> dict:
    g = sub.add_parser("generate", help="one-shot completion of a prompt")
    add_model_options(g, positional=False)
    g.add_argument("prompt")
    add_sampling_options(g)
    add_parallel_options(g)
    return {"generate": cmd_generate}


def cmd_generate(ns: argparse.Namespace) -> int:
    from mlxr.cli.progress import load_llm
    from mlxr.cli.stream import print_stream

    try:
        parallel = parallel_from(ns)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if parallel.node_rank > 0:  # a further node of the group: its workers only
        return run_node(parallel, ns.device or "cpu")
    params = sampling_from(ns)
    llm = load_llm(model_path(ns.model), ns, parallel=parallel)
    result = print_stream(llm.engine, "generate-0", ns.prompt, params)
    return 130 if result.interrupted else 0
