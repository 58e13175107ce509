"""Token ids -> text deltas while streaming, and stop-string matching over those deltas."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from mlxr.errors import InvalidParameterError

# Prompt tokens decoded together with the first output token, so that a SentencePiece
# leading space (and any decoder context) comes out the same as in a full decode.
PROMPT_CONTEXT_TOKENS = 5
REPLACEMENT_CHAR = "\ufffd"


class TokenDecoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


def prompt_context(prompt_token_ids: Sequence[int]) -> list[int]:
    """The prompt's last ids, decoded before the first output token."""
    return list(prompt_token_ids[max(0, len(prompt_token_ids) - PROMPT_CONTEXT_TOKENS):])


class IncrementalDetokenizer:
    """Turns one token at a time into text deltas.

    Each step decodes a short window of recent ids twice (with and without the new ones) and
    emits the difference, so decoders that strip or merge at token boundaries stay correct.
    Text that ends in U+FFFD is held back: it is a UTF-8 sequence still missing bytes.
    """

    def __init__(
        self,
        tokenizer: TokenDecoder,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids = prompt_context(prompt_token_ids)
        self._prefix = 0  # window start: already-emitted context
        self._read = len(self._ids)  # first id whose text has not been emitted

    def add(self, token_id: int) -> str:
        """Append one token; return the text that became final (may be empty)."""
        self._ids.append(token_id)
        return self._advance(final=False)

    def push(self, token_id: int) -> None:
        """Append one token whose text a later `add` or `flush` gives."""
        self._ids.append(token_id)

    def _accept(self, before: str, after: str, final: bool = False) -> str:
        """The text that became final, given the decoded windows."""
        if len(after) <= len(before) or (after.endswith(REPLACEMENT_CHAR) and not final):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        # Keep only the window; older ids are never decoded again.
        del self._ids[: self._prefix]
        self._read -= self._prefix
        self._prefix = 0
        return after[len(before):]

    def flush(self) -> str:
        """Text still held back at the end (an incomplete UTF-8 sequence decodes to U+FFFD)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self._read == len(self._ids):
            return ""
        return self._accept(self._decode(self._prefix, self._read), self._decode(self._prefix, len(self._ids)), final)

    def _decode(self, start: int, end: int) -> str:
        if start == end:
            return ""
        return self._tokenizer.decode(self._ids[start:end], skip_special_tokens=self._skip)


class StreamDetokenizer:
    """IncrementalDetokenizer's add/flush over the tokenizer's own decode stream: the same
    windowed decode, in Rust, in one call a token. Should the stream refuse a token (it checks that new text only appends to the old,
    which a decoder rewriting earlier text breaks), the Python window takes over."""

    def __init__(self, tokenizer: TokenDecoder, step, context: list[int], skip_special_tokens: bool) -> None:
        self._tokenizer, self._step, self._skip = tokenizer, step, skip_special_tokens
        self._context = context  # ids whose text came out last: the window's start
        self._pending: list[int] = []  # ids since, whose text is held back
        self._python: IncrementalDetokenizer | None = None

    def add(self, token_id: int) -> str:
        if self._python is not None:
            return self._python.add(token_id)
        pending = self._pending
        pending.append(token_id)
        try:
            text = self._step(token_id)
        except Exception:  # noqa: BLE001 - the tokenizers library raises plain Exception
            self._python = self._window(pending[:-1])
            return self._python.add(token_id)
        if text is None:
            return ""
        self._context, self._pending = pending, []
        return text

    def flush(self) -> str:
        window = self._python or self._window(self._pending)
        return window.flush()

    def _window(self, held: list[int]) -> IncrementalDetokenizer:
        """The Python detokenizer after the last emitted ids, holding `held`."""
        window = IncrementalDetokenizer(self._tokenizer, self._context, self._skip)
        for token_id in held:
            window.push(token_id)
        return window


def make_detokenizer(tokenizer: TokenDecoder, prompt_token_ids: Sequence[int],
                     skip_special_tokens: bool = True) -> IncrementalDetokenizer | StreamDetokenizer:
    """The tokenizer's decode stream where it has one (`decode_stream(context, skip)`, giving
    a step function or None), else the Python window."""
    context = prompt_context(prompt_token_ids)
    factory = getattr(tokenizer, "decode_stream", None)
    step = factory(context, skip_special_tokens) if factory is not None else None
    if step is None:
        return IncrementalDetokenizer(tokenizer, prompt_token_ids, skip_special_tokens)
    return StreamDetokenizer(tokenizer, step, context, skip_special_tokens)


class StopStringMatcher:
    """Cuts streamed text at the first stop string and never lets any of it out.

    `feed` returns what is safe to emit: everything except the longest tail that could still
    grow into a stop string. The cut is where a stop string first completes, which is the
    first-occurrence cut of the whole text (unless one stop string contains another past its
    first character, where the streaming answer is the only one that can be known in time).
    """

    def __init__(self, stops: Sequence[str] | None) -> None:
        stops = list(stops or ())
        if any(not isinstance(s, str) or not s for s in stops):
            raise InvalidParameterError("stop", "each stop string must be a non-empty string")
        self._stops = tuple(dict.fromkeys(stops))
        self._firsts = tuple({s[0] for s in self._stops})  # text without any of them holds no stop, whole or begun
        self._held = ""
        self.matched: str | None = None

    @property
    def hit(self) -> bool:
        return self.matched is not None

    @property
    def active(self) -> bool:
        """Whether there are stop strings to look for (else feed passes text through)."""
        return bool(self._stops)

    def feed(self, delta: str) -> tuple[str, bool]:
        """Add `delta`; return (text safe to emit now, whether a stop string was hit)."""
        if self.matched is not None:
            return "", True
        if not self._stops:
            return delta, False
        text = self._held + delta
        if not any(c in text for c in self._firsts):  # most deltas: a scan, not the search below
            self._held = ""
            return text, False
        found = self._first_completed(text)
        if found is not None:
            start, self.matched = found
            self._held = ""
            return text[:start], True
        keep = self._partial_tail(text)
        self._held = text[len(text) - keep:] if keep else ""
        return text[: len(text) - keep], False

    def flush(self) -> str:
        """The held-back tail, once no more text will come (empty after a hit)."""
        held, self._held = self._held, ""
        return "" if self.matched is not None else held

    def _first_completed(self, text: str) -> tuple[int, str] | None:
        best: tuple[int, int, str] | None = None
        for stop in self._stops:
            start = text.find(stop)
            if start >= 0:
                candidate = (start + len(stop), start, stop)
                if best is None or candidate[:2] < best[:2]:
                    best = candidate
        return None if best is None else (best[1], best[2])

    def _partial_tail(self, text: str) -> int:
        longest = max(len(s) for s in self._stops) - 1
        for size in range(min(longest, len(text)), 0, -1):
            tail = text[len(text) - size:]
            if any(stop.startswith(tail) for stop in self._stops):
                return size
        return 0
