"""Facts about a model on disk, read through the validating format readers, and its digest.

Nothing here writes; a file that fails validation raises before anything is registered.
"""
from __future__ import annotations

import hashlib
import math
import os
import stat
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gguf.constants import LlamaFileType
from safetensors import SafetensorError, safe_open

from mlxr.errors import InvalidParameterError, ModelFormatError
from mlxr.formats.gguf import GGUFFile, open_gguf
from mlxr.formats.json_file import read_json_object
from mlxr.formats.safetensors_dir import shard_files

Progress = Callable[[int, int], None]
_CONFIG = "config.json"
_MAX_CONFIG_BYTES = 16 << 20
_HASH_CHUNK = 4 << 20
_FILE_TYPE_GUESSED = 1024  # llama.cpp's LLAMA_FTYPE_GUESSED flag


@dataclass(frozen=True)
class ModelFacts:
    path: Path  # absolute, symlinks resolved
    format: str  # "gguf" | "safetensors"
    architecture: str
    family: str
    parameter_count: int
    quantization: str
    context_length: int
    size_bytes: int
    content: tuple[Path, ...]  # the files the digest covers, in hashing order


@dataclass(frozen=True)
class Fingerprint:
    """Cheap identity of the content files: total size and newest mtime."""

    size: int
    mtime_ns: int


def inspect_model(path: Path) -> ModelFacts:
    """Validate a .gguf file or a Hugging Face directory and read its facts.
    Raises InvalidParameterError (param "path") for a path that is neither, and
    ModelFormatError / UnsupportedModelError for a broken or unsupported model."""
    resolved = resolve_path(path)
    mode = os.stat(resolved).st_mode
    if stat.S_ISREG(mode) and resolved.suffix.lower() == ".gguf":
        return _gguf_facts(resolved)
    if stat.S_ISDIR(mode) and _is_regular(resolved / _CONFIG):
        return _hf_facts(resolved)
    raise InvalidParameterError(
        "path", f"{path} is neither a .gguf file nor a model directory with {_CONFIG}"
    )


def with_projector_facts(facts: ModelFacts, projector: Path) -> ModelFacts:
    """facts of a GGUF model with its mmproj file: checked to fit the model (formats/mmproj.py
    says what is wrong), its bytes and tensors counted, its file hashed after the model's."""
    from dataclasses import replace

    from mlxr.formats.mmproj import check_mmproj
    from mlxr.models.model_args import args_from_gguf

    if facts.format != "gguf":
        raise InvalidParameterError("projector", "an mmproj file goes with a GGUF model; a Hugging Face "
                                                 "directory holds its own vision tower")
    path = resolve_path(projector, "projector")
    with open_gguf(facts.path) as f:
        hidden = args_from_gguf(f).hidden_size
    check_mmproj(path, facts.architecture, hidden)
    with open_gguf(path) as f:
        count = sum(f.tensor_info(n).n_elements for n in f.tensor_names)
        size = f.file_size
    return replace(facts, parameter_count=facts.parameter_count + count, size_bytes=facts.size_bytes + size,
                   content=(*facts.content, path))


def resolve_path(path: Path, param: str = "path") -> Path:
    try:
        return Path(path).expanduser().resolve(strict=True)
    except FileNotFoundError:
        raise InvalidParameterError(param, f"{path} does not exist") from None
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop
        raise InvalidParameterError(param, f"cannot resolve {path}: {e}") from None


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _gguf_facts(path: Path) -> ModelFacts:
    from mlxr.models.model_args import args_from_gguf  # the declarations live beside torch models

    with open_gguf(path) as f:
        args = args_from_gguf(f)
        arch = f.architecture
        count = sum(f.tensor_info(n).n_elements for n in f.tensor_names)
        quant = _gguf_quantization(f)
        size = f.file_size
    return ModelFacts(path, "gguf", arch, arch, count, quant, args.max_position_embeddings,
                      size, (path,))


def _gguf_quantization(f: GGUFFile) -> str:
    file_type = f.metadata.get("general.file_type")
    if isinstance(file_type, int) and not isinstance(file_type, bool):
        try:
            name = LlamaFileType(file_type & ~_FILE_TYPE_GUESSED).name
            return name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass  # unknown to this gguf-py: fall back to what the tensors hold
    return _dominant((f.tensor_info(n).ggml_type, f.tensor_info(n).n_elements)
                     for n in f.tensor_names)


def _dominant(pairs: Iterable[tuple[str, int]]) -> str:
    """The type holding the most elements."""
    counts: Counter[str] = Counter()
    for type_name, n in pairs:
        counts[type_name] += n
    return counts.most_common(1)[0][0] if counts else "unknown"


def _hf_facts(root: Path) -> ModelFacts:
    from mlxr.models.model_args import args_from_hf

    config = _read_config(root / _CONFIG)
    args = args_from_hf(config)
    shards = sorted(shard_files(root), key=lambda p: p.name)
    counts: Counter[str] = Counter()
    for shard in shards:
        counts.update(_shard_elements(shard))
    quant = config.get("quantization_config")
    nf4 = isinstance(quant, dict) and quant.get("load_in_4bit") and quant.get("bnb_4bit_quant_type") == "nf4"
    return ModelFacts(
        root, "safetensors", args.model_type, args.model_type, sum(counts.values()),
        "NF4" if nf4 else _dominant(counts.items()), args.max_position_embeddings, directory_size(root),
        tuple(shards),
    )


def _read_config(path: Path) -> dict:
    return read_json_object(path, _MAX_CONFIG_BYTES)


def _shard_elements(path: Path) -> Counter[str]:
    """Elements per dtype, from the header only (safe_open checks it against the file)."""
    if not _is_regular(path):
        raise ModelFormatError(f"{path.name} is not a regular file")
    counts: Counter[str] = Counter()
    try:
        with safe_open(path, framework="numpy") as f:
            for name in f.keys():
                sl = f.get_slice(name)
                counts[sl.get_dtype()] += math.prod(sl.get_shape())
    except SafetensorError as e:
        raise ModelFormatError(f"{path.name} is not a valid safetensors file: {e}") from None
    except OSError as e:
        raise ModelFormatError(f"cannot read {path.name}: {e.strerror}") from None
    return counts


def directory_size(root: Path) -> int:
    """Bytes of the regular files under root; symlinked directories are not followed."""
    total = 0
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            try:
                st = os.stat(os.path.join(dirpath, name))
            except OSError:
                continue  # a dangling link is not part of the model
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def fingerprint(files: Sequence[Path]) -> Fingerprint:
    stats = [os.stat(p) for p in files]
    return Fingerprint(sum(s.st_size for s in stats), max((s.st_mtime_ns for s in stats), default=0))


def digest_files(files: Sequence[Path], progress: Progress | None = None) -> str:
    """"sha256:<hex>" of the files' bytes, concatenated in the given order."""
    total = sum(os.stat(p).st_size for p in files)
    h = hashlib.sha256()
    done = 0
    if progress is not None:
        progress(0, total)
    for path in files:
        with open(path, "rb") as fh:
            while chunk := fh.read(_HASH_CHUNK):
                h.update(chunk)
                done += len(chunk)
                if progress is not None:
                    progress(done, total)
    if done != total:
        raise ModelFormatError(f"{files[0].parent} changed while it was being hashed")
    return f"sha256:{h.hexdigest()}"
