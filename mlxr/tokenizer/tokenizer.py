"""The tokenizer the engine and server use: encode/decode, special ids, chat template."""
from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken

from mlxr.chat.template import ChatTemplate, default_template_for
from mlxr.errors import (
    InvalidParameterError,
    ModelFormatError,
    TemplateError,
)
from mlxr.formats.json_file import MAX_JSON_BYTES, read_json_object
from mlxr.tokenizer.gguf_vocab import vocab_from_gguf_metadata
from mlxr.tokenizer.sentencepiece_file import load_sentencepiece_model

log = logging.getLogger(__name__)

# End-of-turn markers of common chat formats; generation stops on them when the vocab has them.
END_OF_TURN_TOKENS = ("<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|endoftext|>")


class Tokenizer:
    """A `tokenizers.Tokenizer` plus what the model files say about BOS/EOS and chat."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        add_bos: bool | None = None,
        add_eos: bool | None = None,
        extra_stop_ids: Iterable[int] = (),
        chat_template: str | None = None,
        architecture: str | None = None,
        vocab_size: int | None = None,
    ) -> None:
        # add_bos/add_eos None: the backend's post-processor decides, as in tokenizer.json.
        self._backend = backend
        self._bos = bos_token_id
        self._eos = eos_token_id
        self._explicit_specials = add_bos is not None or add_eos is not None
        self._add_bos = bool(add_bos) and bos_token_id is not None
        self._add_eos = bool(add_eos) and eos_token_id is not None
        self._vocab_size = vocab_size or backend.get_vocab_size(with_added_tokens=True)
        self._chat_template = chat_template
        self.architecture = architecture
        self._stop_ids = self._collect_stop_ids(extra_stop_ids)
        self._special_ids = frozenset(
            i for i, t in backend.get_added_tokens_decoder().items() if t.special
        )
        self._template_source = chat_template or self._default_template()
        self._compiled: ChatTemplate | None = None


    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        """Build from a GGUF file's `tokenizer.*` metadata (see gguf_vocab)."""
        v = vocab_from_gguf_metadata(metadata)
        return cls(
            v.tokenizer, bos_token_id=v.bos_token_id, eos_token_id=v.eos_token_id,
            add_bos=v.add_bos, add_eos=v.add_eos, extra_stop_ids=v.extra_stop_ids,
            chat_template=v.chat_template, architecture=v.architecture,
            vocab_size=len(metadata["tokenizer.ggml.tokens"]),
        )

    @classmethod
    def from_hf_dir(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Build from a Hugging Face model directory (tokenizer.json or tokenizer.model)."""
        root = Path(path)
        config = _read_json(root / "tokenizer_config.json")
        add_bos, add_eos = config.get("add_bos_token"), config.get("add_eos_token")
        if (root / "tokenizer.json").is_file():
            backend = _load_tokenizer_json(root / "tokenizer.json")
            spm_ids: dict[str, int | None] = {}
        elif (root / "tokenizer.model").is_file():
            backend, spm_ids = load_sentencepiece_model(root / "tokenizer.model")
            _add_config_tokens(backend, config)
            # SentencePiece tokenizers (Llama, Gemma) add BOS unless the config says otherwise.
            add_bos = True if add_bos is None else add_bos
        else:
            raise ModelFormatError(f"{root} has neither tokenizer.json nor tokenizer.model")
        bos = _token_id(backend, config.get("bos_token"), "bos_token", spm_ids.get("bos"))
        eos = _token_id(backend, config.get("eos_token"), "eos_token", spm_ids.get("eos"))
        stops = _config_eos_ids(root, backend)
        return cls(
            backend, bos_token_id=bos, eos_token_id=eos if eos is not None else next(iter(stops), None),
            add_bos=add_bos, add_eos=add_eos, extra_stop_ids=stops,
            chat_template=_find_chat_template(root, config), architecture=_model_type(root),
        )


    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; with add_special_tokens, BOS/EOS as the model wants them."""
        if not isinstance(text, str):
            raise InvalidParameterError("prompt", "must be a string")
        if not self._explicit_specials:
            return self._backend.encode(text, add_special_tokens=add_special_tokens).ids
        ids = self._backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self._add_bos:
            ids.insert(0, self._bos)  # type: ignore[arg-type]
        if add_special_tokens and self._add_eos:
            ids.append(self._eos)  # type: ignore[arg-type]
        return ids

    def encode_pair(self, first: str, second: str) -> tuple[list[int], list[int]]:
        """(ids, token types) of a (query, document) pair as a cross-encoder reads it: the
        tokenizer's pair template, or, where BOS/EOS are added explicitly (a GGUF vocabulary),
        BOS first EOS EOS second EOS (RoBERTa's layout, the one llama.cpp's rerank builds)."""
        if not self._explicit_specials:
            enc = self._backend.encode(first, second)
            return enc.ids, enc.type_ids
        a = self._backend.encode(first, add_special_tokens=False).ids
        b = self._backend.encode(second, add_special_tokens=False).ids
        bos = [self._bos] if self._add_bos else []
        eos = [self._eos] if self._eos is not None else []
        ids = bos + a + eos + eos + b + eos
        return ids, [0] * len(ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def decode_stream(self, context_ids: list[int], skip_special_tokens: bool = True):
        """The step function of a Rust decode stream that starts after context_ids: takes the
        next token id, gives the text that became final or None while it is held back (see
        engine/frontend/detokenizer.py). None where the installed tokenizers has no such stream."""
        try:
            from tokenizers.decoders import DecodeStream

            stream = DecodeStream(ids=context_ids, skip_special_tokens=skip_special_tokens)
        except (ImportError, TypeError):  # tokenizers before 0.21 has none; before 0.22, no starting ids
            return None
        return functools.partial(stream.step, self._backend)

    def id_to_token(self, token_id: int) -> str:
        if not 0 <= token_id < self._vocab_size:
            raise InvalidParameterError("token_id", f"{token_id} is outside the vocabulary")
        return self._backend.id_to_token(token_id) or ""

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def backend_json(self) -> str:
        """The vocabulary as tokenizer.json text (grammar engines build their token tables from it)."""
        return self._backend.to_str()


    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def bos_token_id(self) -> int | None:
        return self._bos

    @property
    def eos_token_id(self) -> int | None:
        return self._eos

    @property
    def add_bos_token(self) -> bool:
        if self._explicit_specials:
            return self._add_bos
        ids = self._backend.encode("", add_special_tokens=True).ids
        return bool(ids) and ids[0] == self._bos

    @property
    def stop_token_ids(self) -> frozenset[int]:
        """EOS plus end-of-turn tokens: generation stops on any of them."""
        return self._stop_ids

    @property
    def special_token_ids(self) -> frozenset[int]:
        return self._special_ids

    @property
    def chat_template(self) -> str | None:
        """The template the model files carry (None when they carry none)."""
        return self._chat_template

    @property
    def template_source(self) -> str | None:
        """The template chats render with: the model's own, else the built-in one (or None)."""
        return self._template_source


    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """Render a conversation to prompt text; encode it with add_special_tokens=False."""
        if self._template_source is None:
            raise TemplateError("this model has no chat template; send a plain prompt instead")
        if self._compiled is None:
            self._compiled = ChatTemplate(self._template_source)
        variables = {**self._special_token_texts(), **kwargs}
        return self._compiled.render(
            messages, add_generation_prompt=add_generation_prompt, tools=tools, **variables
        )

    def _special_token_texts(self) -> dict[str, str]:
        names = {"bos_token": self._bos, "eos_token": self._eos}
        return {k: self._backend.id_to_token(i) or "" for k, i in names.items() if i is not None}

    def _default_template(self) -> str | None:
        template = default_template_for(self.architecture) if self.architecture else None
        if template is not None:
            log.info("the %s model files carry no chat template; using the built-in one", self.architecture)
        return template

    def _collect_stop_ids(self, extra: Iterable[int]) -> frozenset[int]:
        ids = {i for i in extra if 0 <= i < self._vocab_size}
        if self._eos is not None:
            ids.add(self._eos)
        for name in END_OF_TURN_TOKENS:
            found = self._backend.token_to_id(name)
            if found is not None:
                ids.add(found)
        return frozenset(ids)


def _read_json(path: Path) -> dict[str, Any]:
    return read_json_object(path, MAX_JSON_BYTES) if path.is_file() else {}


def _load_tokenizer_json(path: Path) -> tokenizers.Tokenizer:
    if path.stat().st_size > MAX_JSON_BYTES:
        raise ModelFormatError(f"{path.name} is larger than {MAX_JSON_BYTES} bytes")
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises plain Exception for malformed files
        raise ModelFormatError(f"{path.name} could not be loaded: {e}") from e


def _token_text(value: Any, field: str) -> str | None:
    # tokenizer_config.json writes a token as a string or as {"content": ..., ...}.
    if isinstance(value, Mapping):
        value = value.get("content")
    if value is not None and not isinstance(value, str):
        raise ModelFormatError(f"tokenizer_config.json {field} must be a string")
    return value


def _token_id(
    backend: tokenizers.Tokenizer, value: Any, field: str, fallback: int | None
) -> int | None:
    text = _token_text(value, field)
    if text is None:
        return fallback
    token_id = backend.token_to_id(text)
    if token_id is None:
        raise ModelFormatError(f"tokenizer_config.json {field} {text!r} is not in the vocabulary")
    return token_id


def _add_config_tokens(backend: tokenizers.Tokenizer, config: Mapping[str, Any]) -> None:
    # With only tokenizer.model, tokens added on top of it are listed in the config.
    added = config.get("added_tokens_decoder") or {}
    if not isinstance(added, Mapping):
        raise ModelFormatError("tokenizer_config.json added_tokens_decoder must be an object")
    for key in sorted(added, key=lambda k: int(k) if str(k).isdigit() else -1):
        info = added[key]
        content = _token_text(info, "added_tokens_decoder")
        if not str(key).isdigit() or not content:
            raise ModelFormatError(f"tokenizer_config.json added token {key!r} is malformed")
        existing = backend.token_to_id(content)
        if existing is None and int(key) != backend.get_vocab_size(with_added_tokens=True):
            raise ModelFormatError(f"added token {content!r} has id {key}, not the next free id")
        if existing is not None and existing != int(key):
            raise ModelFormatError(f"added token {content!r} has id {key} but the vocab says {existing}")
        special = bool(info.get("special", True)) if isinstance(info, Mapping) else True
        token = AddedToken(content, special=special, normalized=False)
        (backend.add_special_tokens if special else backend.add_tokens)([token])


def _config_eos_ids(root: Path, backend: tokenizers.Tokenizer) -> list[int]:
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        value = _read_json(root / name).get("eos_token_id")
        values = value if isinstance(value, list) else [value]
        ids += [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    size = backend.get_vocab_size(with_added_tokens=True)
    return list(dict.fromkeys(i for i in ids if 0 <= i < size))


def _find_chat_template(root: Path, config: Mapping[str, Any]) -> str | None:
    jinja_file = root / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if template is None:
        template = _read_json(root / "chat_template.json").get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default", next(iter(named.values()), None))
    if template is not None and not isinstance(template, str):
        raise ModelFormatError("tokenizer_config.json chat_template must be a string")
    return template


def _model_type(root: Path) -> str | None:
    value = _read_json(root / "config.json").get("model_type")
    return value if isinstance(value, str) else None
