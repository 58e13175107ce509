"""Compiles grammars off the step loop: a worker thread builds llguidance's view of the vocabulary
once (seconds for a 262k vocabulary), builds each distinct grammar's text once (cached by
content hash, bounded; admission checked it: grammar.admitted_text), and compiles a matcher
of its own for every request.

Why not a copy of one cached matcher: LLMatcher.deep_copy shares the original's lexer behind
one mutex (llguidance 1.9: the Python copy clones the Rust Parser, which keeps its Arc; only
Parser::deep_clone, not exposed to Python, copies the lexer), and a mask computation holds that
mutex throughout. Copies of one template fill their masks one at a time whatever the executor's
threads, each on a core whose caches are cold: on an H100 host, batch-64 rows of one schema took
~160 us a row, as much as a single stream's one row (bench/results/2026-11-24/
structured_overhead-20261124T231156Z.json). A compile costs ~0.2-0.4 ms for the test suite's
schemas (tests/structured_schemas.py, 32k and 49k vocabularies) and runs here, off the step loop,
on a few threads: llguidance compiles with the GIL released, and a burst of constrained requests
(a client's 64 at once) was a queue of compiles that the engine admitted in dribs, each a prefill
step of its own beside the rows already decoding (64 compiles of bench/structured_overhead.py's
schema on 2 cores: 27 ms on one thread, 17 ms on two)."""
from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance

from mlxr.engine.structured.grammar import admitted_text, parser_limits, spec_key
from mlxr.engine.structured.matcher import GrammarState
from mlxr.engine.structured.trial import parser_failure
from mlxr.errors import InvalidParameterError
from mlxr.types import StructuredOutputsParams

log = logging.getLogger(__name__)

CACHE_SIZE = 256
MAX_COMPILE_THREADS = 8  # a burst of 64 compiles in ~8 rounds; idle threads cost nothing


def compile_threads() -> int:
    return max(1, min(MAX_COMPILE_THREADS, len(os.sched_getaffinity(0))))


class GrammarCompiler:
    def __init__(self, tokenizer, vocab_size: int) -> None:
        """tokenizer: mlxr.tokenizer.tokenizer.Tokenizer (its tokenizer.json and stop ids);
        vocab_size: the model's logits width, which may pass the tokenizer's."""
        self._tokenizer, self.vocab_size = tokenizer, max(vocab_size, tokenizer.vocab_size)
        self._ll: llguidance.LLTokenizer | None = None
        self._ll_error: str | None = None  # why llguidance refused the vocabulary (asked once)
        self._cache: OrderedDict[str, str] = OrderedDict()  # content hash -> checked grammar text
        self._lock = threading.Lock()
        self._ll_lock = threading.Lock()  # the vocabulary's view is built once, by one thread
        self._pool = ThreadPoolExecutor(compile_threads(), thread_name_prefix="mlxr-grammar")

    def submit(self, spec: StructuredOutputsParams) -> Future:
        """A future GrammarState (or the InvalidParameterError that names the problem)."""
        return self._pool.submit(self.compile, spec)

    def compile(self, spec: StructuredOutputsParams) -> GrammarState:
        key = spec_key(spec)
        with self._lock:
            text = self._cache.get(key)
            if text is not None:
                self._cache.move_to_end(key)
        if text is None:
            text = admitted_text(spec)
        matcher = llguidance.LLMatcher(self.ll_tokenizer(), text, limits=parser_limits(), log_level=0)
        matcher.compute_bitmask()  # the lexer's first states are built here, not in the step loop
        if matcher.is_error():
            error = matcher.get_error()
            raise InvalidParameterError("structured_outputs", parser_failure(error) or error[:500])
        with self._lock:
            self._cache[key] = text
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return GrammarState(matcher)

    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the vocabulary; a tokenizer it cannot read makes every structured
        request a 400 that says so (a request's problem to hear of, not a server error)."""
        if self._ll is None and self._ll_error is None:
            with self._ll_lock:
                if self._ll is None and self._ll_error is None:
                    self._build_ll_tokenizer()
        if self._ll is None:
            raise InvalidParameterError("structured_outputs", self._ll_error)
        return self._ll

    def _build_ll_tokenizer(self) -> None:
        tok = self._tokenizer
        try:
            self._ll = llguidance.LLTokenizer(tok.backend_json(), n_vocab=self.vocab_size,
                                              eos_token=sorted(tok.stop_token_ids) or None)
        except Exception as e:  # noqa: BLE001 - llguidance raises several kinds for forms it lacks
            self._ll_error = f"this model's tokenizer cannot drive a grammar: {type(e).__name__}: {e}"[:500]
            log.warning("structured output unavailable: %s", self._ll_error)
        else:
            log.info("structured output: vocabulary of %d tokens ready", self.vocab_size)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
