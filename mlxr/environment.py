"""Every MLXR_* name the package reads, declared in one place (stdlib only: no torch).

`SWITCHES` lists each environment variable read under mlxr/ (Python and the C kernels) and each
MLXR_* compile-time define of the C sources, with its type, its default and why it exists.
`TOOLING` lists the MLXR_* variables that only bench/ and tests/ read. The reading sites stay
where they are; tests/unit/test_environment_doc.py checks that this declaration and the sources
name the same switches, and that docs/environment.md is what `render()` writes:

    python -m mlxr.environment --write      # regenerate docs/environment.md
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

ENVIRONMENT = "environment"  # read from the process environment at run time
BUILD = "build"  # a C preprocessor name, set by the build (mlxr/ops/cpu/cpu_build.py) or by the source itself


@dataclass(frozen=True)
class Switch:
    """One MLXR_* name: what it holds, its value when unset, and why it exists."""

    name: str
    type: str
    default: str
    why: str
    kind: str = ENVIRONMENT


SWITCHES: tuple[Switch, ...] = (
    # Where things live, and how the server is reached
    Switch("MLXR_HOME", "path", "~/.mlxr",
           "The data directory: the model registry (registry.db), pulled models (models/) and Ollama "
           "blobs (blobs/). "
           "Every verb's --home wins over it."),
    Switch("MLXR_CACHE_DIR", "path", "~/.cache/mlxr",
           "Where the C kernels are compiled to and cached (its kernels/ folder), keyed by a hash of "
           "the source, the flags and the CPU's features; and Triton's GPU kernels (triton/<Triton "
           "version>/, unless TRITON_CACHE_DIR is set), so a restart loads what the first start compiled."),
    Switch("MLXR_API_KEY", "string", "unset (no key)",
           "The Bearer key of `mlxr serve` when neither --api-key nor --api-key-file is given; "
           "`mlxr ps` sends it too. A blank value is refused."),
    Switch("MLXR_HOST", "host[:port]", "127.0.0.1 (port 11434)",
           "The server that `mlxr ps` asks when --host is not given."),
    Switch("MLXR_API_SERVERS", "int, 1-16", "1",
           "`mlxr serve --api-servers`: API processes in front of each engine core; above 1 the "
           "models named at start are pinned."),
    Switch("MLXR_MODEL_SLOT_WAIT_S", "float, seconds", "120",
           "How long a request for a model that is not loaded waits for a busy slot "
           "(--max-loaded-models) before a 503 with Retry-After; read once at import."),
    Switch("MLXR_MAX_PROMPT_CHARS", "int, > 0", "4194304",
           "Characters of any rendered prompt (chat template, Ollama template, raw prompt) above "
           "which a request is a 400 before tokenizing; read per request, anything else keeps the default."),
    Switch("MLXR_MAX_IMAGE_BYTES", "int, > 0", "20971520",
           "The largest encoded image file (PNG, JPEG, ...) a request may send; above it the request is a "
           "400 naming the image; read per request."),
    Switch("MLXR_MAX_IMAGE_PIXELS", "int, > 0", "40000000",
           "Width x height above which an image is refused from its header, before any pixel is decoded "
           "(decompression bombs); read per request."),
    Switch("MLXR_MAX_IMAGES", "int, > 0", "8",
           "Images one request may carry (a vision model's prompt); read per request."),
    Switch("MLXR_MAX_IMAGE_TILES", "int, > 0", "37",
           "Tiles one image may split into where the model tiles images (Idefics3, SmolVLM); above it the "
           "request is a 400 naming the image; read per request."),
    Switch("MLXR_LLAMA_BIN", "path", "/work/lcpp/llama.cpp/build-cpu/bin",
           "The folder of llama.cpp's binaries whose llama-mtmd-cli the vision comparison test and "
           "bench/vision_encode.py run (the test skips without it)."),
    Switch("MLXR_LLAMA_CPP_SRC", "path", "/work/lcpp/llama.cpp",
           "A full llama.cpp source tree, for the LLaVA mmproj fixture (its legacy "
           "convert_image_encoder_to_gguf.py, which the converter's sdist tree lacks); without one "
           "those tests skip."),
    Switch("MLXR_GRAMMAR_CHECK_BUDGET_S", "float, seconds", "10",
           "One time budget for all of a request's grammar checks (response_format, forced tool "
           "calls); a check past it is stopped and the request is a 400; read per request."),
    Switch("MLXR_REASONING_EFFORT_TOKENS", "level=int list, comma-separated", "minimal=256,low=1024,medium=4096",
           "Reasoning tokens per effort level (Responses reasoning.effort, Chat Completions "
           "reasoning_effort, Ollama think levels) before the end of the reasoning is forced; "
           "\"high\" is bounded by max_tokens alone; read per request, a level given badly keeps its default."),
    # Engine
    Switch("MLXR_QUANT_GEMM_TABLE", "path or `none`", "mlxr/ops/quant/gemm_table.json",
           "The measured table from which GGUF products of more than 16 rows on the GPU pick the fused "
           "tensor-core GEMM, the repacked GEMM (and which layers are repacked at load) or dequantize "
           "+ cuBLAS (bench/kernels/quant_gemm_table.py writes it); "
           "`none` takes dequantize + cuBLAS everywhere (A/B runs); read once."),
    Switch("MLXR_NUM_THREADS", "int, 1-1024", "every CPU the process may use",
           "CPU threads for the model's math when --threads is not given (generate, run, bench, serve)."),
    Switch("MLXR_ENGINE_PROCESS", "flag (1/true/yes/on, else off)",
           "unset: a process of its own on CUDA, a thread on the CPU",
           "Where the engine core runs (EngineConfig.engine_process). --api-servers above 1 needs a "
           "process and refuses 0."),
    Switch("MLXR_JUMP_FORWARD", "flag (1/true/yes/on, else off)", "on",
           "Structured output drafts the tokens its grammar forces and verifies them in the step "
           "(EngineConfig.jump_forward); --jump-forward / --no-jump-forward win over it."),
    Switch("MLXR_SPEC_COST_TABLE", "path or `none`", "mlxr/engine/spec_decode/cost_table.json",
           "The step costs measured per device kind (bench/kernels/spec_cost_table.py writes them) from which "
           "n-gram and suffix speculation choose each step's drafts at any batch "
           "(EngineConfig.speculative_cost_table); a device without an entry, or `none`: no drafts past "
           "--speculative-max-batch requests; read when an EngineConfig is built."),
    Switch("MLXR_SUFFIX_MAX_DEPTH", "int, 2-64", "24",
           "Suffix decoding (--speculative-method suffix): tokens of a suffix-tree path; a match and its "
           "draft share them (SuffixConfig.max_depth); read when an EngineConfig is built."),
    Switch("MLXR_SUFFIX_WINDOW", "int, 16-1048576", "4096",
           "Suffix decoding: the latest tokens of a prompt that a request's tree indexes, and of a finished "
           "output that the shared tree keeps (a longer prompt costs no more work)."),
    Switch("MLXR_SUFFIX_MAX_NODES", "int, 1024-16777216", "131072",
           "Suffix decoding: nodes of one request's tree; past them it is rebuilt from its latest tokens "
           "(half the bound), so a hostile prompt or output cannot grow it further."),
    Switch("MLXR_SUFFIX_CACHE_RESPONSES", "int, 0-65536", "256",
           "Suffix decoding: finished outputs the shared tree keeps (least recently finished evicted "
           "first); 0: no cross-request tree (drafts only from the request itself)."),
    Switch("MLXR_SUFFIX_CACHE_NODES", "int, 1024-16777216", "524288",
           "Suffix decoding: nodes of the shared tree of finished outputs; past them the oldest outputs go."),
    Switch("MLXR_GRAMMAR_THREADS", "int, 1-64", "llguidance's own (80% of the CPUs, at most 32)",
           "Threads of llguidance's executor, which fills grammar masks and takes landed tokens; "
           "anything but a positive integer logs a warning and keeps the default."),
    # Kernels: which implementation runs
    Switch("MLXR_KERNELS", "reference | auto", "auto",
           "`reference` runs the torch reference ops instead of the Triton kernels on CUDA and of "
           "the quantized C matmul on the CPU (dequantize + fp32 GEMM), for A/B comparisons. Read "
           "per call by the dispatchers, once at import by the quantized CPU path."),
    Switch("MLXR_CPU_KERNELS", "auto | native | avx2 | portable (x86); dotprod | neon | portable (aarch64)",
           "auto (native on x86; armv8.2-a+dotprod or armv8-a on aarch64, from /proc/cpuinfo)",
           "The CPU target the C kernels are built for; an older target rules a kernel path out. "
           "An unknown value logs an error and uses auto. Read once."),
    Switch("MLXR_AMX", "flag (0 turns it off)", "on where the CPU and Linux grant the AMX tiles",
           "Prompt matmuls of 32+ rows (Q6_K 64+) on Intel AMX-INT8 tiles; 0 sends them to the "
           "AVX-512 VNNI paths, the stand-in for hosts without AMX. Read each call. The build also "
           "defines MLXR_AMX when the compiler targets AMX."),
    Switch("MLXR_VNNI_PANELS", "flag (0 turns it off)", "on",
           "Prompt matmuls of 32+ rows (Q6_K 48+) that AMX does not take run by weight panels on "
           "AVX-512 VNNI; 0 keeps them on the per-row kernel. Read each call."),
    Switch("MLXR_POOL", "1 | 0", "unset: the pool for matmuls of up to 8 rows under OMP_WAIT_POLICY=PASSIVE, else none",
           "Which quantized matmuls run on the kernels' own thread pool rather than OpenMP's team: "
           "1 all, 0 none. Read once."),
    Switch("MLXR_POOL_SPIN_US", "float, microseconds", "60",
           "How long an idle pool helper polls for the next job before it sleeps; 0 never spins. "
           "Read once."),
    Switch("MLXR_PDL", "flag (0 turns it off)", "on (CUDA)",
           "Programmatic dependent launch of the decode kernels on Hopper: a kernel may start while "
           "the previous one drains. Read when a kernel launches."),
    Switch("MLXR_Q4_1_HALVES", "flag (0 turns it off)", "on",
           "The Q4_1 Triton GEMV reads each quant word's low and high nibbles as two contiguous "
           "halves (vector loads of x); 0 restores the one-tile order. Read once at import."),
    # Tensor parallelism: set by the launcher for its workers
    Switch("MLXR_TP_DEVICE", "cpu | cuda", "cpu",
           "A tensor-parallel worker's device type; the launcher sets it for every worker it starts."),
    Switch("MLXR_TP_PARENT_PID", "int, a pid", "unset",
           "The launcher's pid: a worker that has it dies with its parent (PR_SET_PDEATHSIG), so no "
           "process is left behind."),
    Switch("MLXR_TP_TIMEOUT_S", "float, seconds", "600",
           "The rendezvous's and every collective's time limit in a worker (ParallelConfig.timeout_s, "
           "passed on by the launcher)."),
    # Compile-time names of the C sources
    Switch("MLXR_PREFETCH_HINT", "int, 0-3", "0 (Intel CPUs: 2)",
           "The locality of quant.c's weight prefetch, chosen by CPU vendor in cpu_build.py: the "
           "non-temporal hint read fastest on AMD EPYC, the L2 hint on an Intel Xeon with AMX.", BUILD),
    Switch("MLXR_PORTABLE", "defined or not", "not defined",
           "cpu_build.py's aarch64 `portable` target: quant.c leaves its NEON kernels out and "
           "compiles the portable C.", BUILD),
    Switch("MLXR_VNNI", "defined or not", "defined when the target has AVX-512 VNNI, VL, BW and GFNI",
           "quant.c's AVX-512 VNNI + GFNI kernels.", BUILD),
    Switch("MLXR_AVX2", "defined or not", "defined when the target has AVX2, FMA and F16C (and no VNNI)",
           "quant_generic.h's AVX2 kernel.", BUILD),
    Switch("MLXR_NEON", "defined or not", "defined on aarch64 with NEON (not the portable target)",
           "quant_generic.h's sums in NEON (quant_neon.h).", BUILD),
    Switch("MLXR_NEON_DOT", "defined or not", "defined on aarch64 with the dot product instructions",
           "The NEON kernels use sdot on the activations' int8 parts.", BUILD),
    Switch("MLXR_HALF_H", "defined or not", "defined once half.h is included",
           "half.h's include guard.", BUILD),
)

TOOLING: tuple[Switch, ...] = (
    Switch("MLXR_BENCH_RESULTS", "path", "bench/results/<day>/",
           "Where the benchmark scripts write their JSON."),
    Switch("MLXR_COMMIT", "git commit", "the checkout's HEAD",
           "The commit a benchmark records, where the lent GPU machine's copy of the tree has no "
           "usable .git; the GPU lease scripts take it too."),
    Switch("MLXR_LLAMA_CPP_SITE", "path", "unset",
           "The site-packages of a llama-cpp-python installed apart, for the agreement bench and test."),
    Switch("MLXR_LLAMA_SERVER", "path", "unset",
           "A llama-server binary, for the test that runs llama.cpp's converted files beside MLXR "
           "(tests/models/test_gguf_variants.py)."),
    Switch("MLXR_TINYLLAMA_GGUF_DIR", "path", ".fixtures/tinyllama-quantized",
           "The TinyLlama-shape GGUF files llama.cpp quantized, for the quantized-model tests."),
    Switch("MLXR_CHROMIUM", "path", "/usr/bin/chromium",
           "The browser the web UI tests drive."),
    Switch("MLXR_UPDATE_SCREENSHOTS", "flag (1)", "unset",
           "The web UI browser tests rewrite docs/screenshots/."),
)

# Other tools' variables MLXR honours as they do (so a setup made for them carries over).
FOREIGN: tuple[Switch, ...] = (
    Switch("OLLAMA_KV_CACHE_TYPE", "f16 | q8_0 | q4_0", "unset (auto: the model's dtype)",
           "Ollama's KV cache type: the engine's --kv-cache-dtype when that is not given (f16 is fp16); "
           "any other value is refused when the engine is configured (docs/kv-cache.md)."),
)

DOC_PATH = Path(__file__).resolve().parent.parent / "docs" / "environment.md"


def _table(switches: tuple[Switch, ...]) -> list[str]:
    rows = ["| name | type | default | why |", "|---|---|---|---|"]
    for s in switches:
        cells = (f"`{s.name}`", s.type, s.default, s.why)
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return rows


def render() -> str:
    """docs/environment.md, from the declarations above."""
    runtime = tuple(s for s in SWITCHES if s.kind == ENVIRONMENT)
    build = tuple(s for s in SWITCHES if s.kind == BUILD)
    lines = [
        "# Environment variables",
        "",
        "Generated from `mlxr/environment.py` by `python -m mlxr.environment --write`; edit the",
        "declaration there, not this page. A command-line flag, where one exists, wins over its",
        "variable. Besides these, `mlxr` sets `OMP_WAIT_POLICY=PASSIVE` before torch loads unless it",
        "is set ([cpu.md](cpu.md)), and the hub download honours `HF_ENDPOINT` and `HF_TOKEN`",
        "([models.md](models.md)).",
        "",
        "## Read at run time",
        "",
        *_table(runtime),
        "",
        "## Compile-time names of the C kernels",
        "",
        "Not environment variables: preprocessor names that the build (`cpu_build.py`) passes or the",
        "sources define from the compiler's target, listed so that every MLXR_* name has one entry.",
        "",
        *_table(build),
        "",
        "## Read by the benchmarks and tests only",
        "",
        *_table(TOOLING),
        "",
        "## Other tools' variables, honoured as they mean them",
        "",
        *_table(FOREIGN),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    text = render()
    if argv == ["--write"]:
        DOC_PATH.write_text(text)
    elif argv:
        print("usage: python -m mlxr.environment [--write]", file=sys.stderr)
        return 2
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
