"""llguidance against xgrammar on MLXR's bundled vocabularies: grammar compile time, token-mask
time per step (a random walk through each grammar, the same tokens for both libraries where they
agree), and the time to refuse or accept hostile specs. Writes bench/results/structured_engines-*.json.

  python bench/peers/structured_engines.py
"""
from __future__ import annotations

import json
import random
import time
from importlib.metadata import version

import llguidance
import llguidance.torch as llg_torch
import torch
import xgrammar as xgr
from transformers import PreTrainedTokenizerFast

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common, latency, ...)
from common import median, print_table, write_result
from structured_overhead import SCHEMA as ROWS_SCHEMA, cpu_model
from mlxr.bundled_models import bundled_path
from mlxr.engine.structured.grammar import JSON_STYLE
from mlxr.formats.gguf import open_gguf
from mlxr.tokenizer.tokenizer import Tokenizer

SCHEMAS = {
    "small": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False},
    "nested": {"type": "object", "required": ["a", "b"], "properties": {
        "a": {"type": "array", "items": {"type": "object", "required": ["x", "tags"], "properties": {
            "x": {"type": "number", "minimum": 0, "maximum": 10},
            "tags": {"type": "array", "items": {"enum": ["p", "q", "r"]}, "minItems": 1, "maxItems": 3}}}},
        "b": {"anyOf": [{"type": "string", "pattern": "^[a-z]{2,5}$"}, {"type": "null"}]}}},
    "enum500": {"type": "object", "properties": {"c": {"enum": [f"item{i}" for i in range(500)]}}, "required": ["c"]},
    "rows": ROWS_SCHEMA,
}
STEPS = 60


def allowed(mask: torch.Tensor, vocab: int) -> list[int]:
    bits = ((mask[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).flatten()[:vocab]
    return bits.nonzero().flatten().tolist()


def walk(fill, accept, done, vocab: int, words: int) -> list[float]:
    """Mask times of a random walk (seeded) through the grammar."""
    rnd, mask, times = random.Random(0), torch.full((1, words), -1, dtype=torch.int32), []
    for _ in range(STEPS):
        if done():
            break
        start = time.perf_counter()
        fill(mask)
        times.append(time.perf_counter() - start)
        choices = allowed(mask, vocab)
        if not choices:
            break
        accept(rnd.choice(choices))
    return times


def measure(name: str) -> list[dict]:
    tok = Tokenizer.from_gguf_metadata(open_gguf(bundled_path(name)).metadata)
    vocab, words = tok.vocab_size, (tok.vocab_size + 31) // 32
    start = time.perf_counter()
    ll = llguidance.LLTokenizer(tok.backend_json(), n_vocab=vocab, eos_token=sorted(tok.stop_token_ids))
    ll_init = time.perf_counter() - start
    start = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(PreTrainedTokenizerFast(tokenizer_object=tok._backend),
                                              vocab_size=vocab, stop_token_ids=sorted(tok.stop_token_ids))
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    xg_init = time.perf_counter() - start
    rows = []
    for sname, schema in SCHEMAS.items():
        start = time.perf_counter()
        m = llguidance.LLMatcher(ll, llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_STYLE))
        ll_compile = time.perf_counter() - start
        ll_times = walk(lambda mk: llg_torch.fill_next_token_bitmask(m, mk), m.consume_token, m.is_stopped,
                        vocab, words)
        start = time.perf_counter()
        cg = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
        xg_compile = time.perf_counter() - start
        xm = xgr.GrammarMatcher(cg)
        xg_times = walk(lambda mk: xm.fill_next_token_bitmask(mk, 0), xm.accept_token, xm.is_terminated,
                        vocab, words)
        rows.append({"vocab": name, "schema": sname, "ll_compile_ms": 1e3 * ll_compile, "xg_compile_ms": 1e3 * xg_compile,
                     "ll_mask_us_median": 1e6 * median(ll_times), "xg_mask_us_median": 1e6 * median(xg_times),
                     "ll_mask_us_max": 1e6 * max(ll_times), "xg_mask_us_max": 1e6 * max(xg_times),
                     "ll_tokenizer_s": ll_init, "xg_tokenizer_s": xg_init})
    return rows


def _deep(n: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(n):
        schema = {"type": "object", "properties": {"x": schema}, "required": ["x"]}
    return schema


def hostile() -> list[dict]:
    """Seconds each library takes to compile (or refuse) hostile specs on the SmolLM2 vocabulary."""
    tok = Tokenizer.from_gguf_metadata(open_gguf(bundled_path("smollm2:135m")).metadata)
    ll = llguidance.LLTokenizer(tok.backend_json(), n_vocab=tok.vocab_size, eos_token=sorted(tok.stop_token_ids))
    info = xgr.TokenizerInfo.from_huggingface(PreTrainedTokenizerFast(tokenizer_object=tok._backend),
                                              vocab_size=tok.vocab_size, stop_token_ids=sorted(tok.stop_token_ids))
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    specs = {"deep_200": ("json", _deep(200)), "enum_50000": ("json", {"enum": [f"v{i}xx" for i in range(50_000)]}),
             "regex_(a|b)*a(a|b){25}": ("regex", "(a|b)*a(a|b){25}")}
    rows = []
    for name, (kind, spec) in specs.items():
        start = time.perf_counter()
        grammar = (llguidance.LLMatcher.grammar_from_json_schema(spec) if kind == "json"
                   else llguidance.LLMatcher.grammar_from_regex(spec))
        m = llguidance.LLMatcher(ll, grammar)
        ll_s, ll_error = time.perf_counter() - start, m.get_error()[:80] if m.is_error() else ""
        start = time.perf_counter()
        try:
            compiler.compile_json_schema(json.dumps(spec)) if kind == "json" else compiler.compile_regex(spec)
            xg_error = ""
        except Exception as e:  # noqa: BLE001 - recorded
            xg_error = str(e)[:80]
        rows.append({"spec": name, "ll_s": ll_s, "ll_error": ll_error, "xg_s": time.perf_counter() - start,
                     "xg_error": xg_error})
    return rows


def main() -> None:
    rows = measure("smollm2:135m") + measure("gemma3-270m")
    bad = hostile()
    print_table(bad, ["spec", "ll_s", "ll_error", "xg_s", "xg_error"])
    print_table(rows, ["vocab", "schema", "ll_compile_ms", "xg_compile_ms", "ll_mask_us_median",
                       "xg_mask_us_median", "ll_mask_us_max", "xg_mask_us_max"])
    print(write_result("structured_engines", {"cpu": cpu_model(), "threads": torch.get_num_threads(),
                                              "llguidance": version("llguidance"), "xgrammar": version("xgrammar"),
                                              "rows": rows, "hostile": bad}))


if __name__ == "__main__":
    main()
