"""Compiles grammars off the step loop: a worker thread builds llguidance's view of the vocabulary
once (seconds for a 262k vocabulary), then one matcher per distinct grammar, cached by content
hash (bounded); each request gets a copy of the cached matcher in its start state."""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance

from mlxr.engine.structured.grammar import check, parser_limits, spec_key
from mlxr.engine.structured.matcher import GrammarState
from mlxr.errors import InvalidParameterError
from mlxr.types import StructuredOutputsParams

log = logging.getLogger(__name__)

CACHE_SIZE = 256


class GrammarCompiler:
    def __init__(self, tokenizer, vocab_size: int) -> None:
        """tokenizer: mlxr.loader.tokenizer.Tokenizer (its tokenizer.json and stop ids);
        vocab_size: the model's logits width, which may pass the tokenizer's."""
        self._tokenizer, self.vocab_size = tokenizer, max(vocab_size, tokenizer.vocab_size)
        self._ll: llguidance.LLTokenizer | None = None
        self._cache: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="mlxr-grammar")

    def submit(self, spec: StructuredOutputsParams) -> Future:
        """A future GrammarState (or the InvalidParameterError that names the problem)."""
        return self._pool.submit(self.compile, spec)

    def compile(self, spec: StructuredOutputsParams) -> GrammarState:
        key = spec_key(spec)
        with self._lock:
            template = self._cache.get(key)
            if template is not None:
                self._cache.move_to_end(key)
        if template is None:
            text = check(spec)
            template = llguidance.LLMatcher(self.ll_tokenizer(), text, limits=parser_limits(), log_level=0)
            if template.is_error():
                raise InvalidParameterError("structured_outputs", template.get_error()[:500])
            with self._lock:
                self._cache[key] = template
                while len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)
        return GrammarState(template.deep_copy())

    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        if self._ll is None:
            tok = self._tokenizer
            self._ll = llguidance.LLTokenizer(tok.backend_json(), n_vocab=self.vocab_size,
                                              eos_token=sorted(tok.stop_token_ids) or None)
            log.info("structured output: vocabulary of %d tokens ready", self.vocab_size)
        return self._ll

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
