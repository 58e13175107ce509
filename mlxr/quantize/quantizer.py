"""Source model -> quantized GGUF, written to OUT.tmp and renamed into place."""
from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from mlxr.errors import InvalidParameterError, ModelFormatError, ModelNotFoundError
from mlxr.quantize.encode import encode, encoded_nbytes
from mlxr.quantize.gguf_source import GGUFSource
from mlxr.quantize.hf_source import HFSource
from mlxr.quantize.mix import FILE_TYPES, Choice, FileType, TypePlanner
from mlxr.quantize.source import Source, SourceTensor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TensorReport:
    name: str
    shape: tuple[int, ...]
    ggml_type: str
    wanted_type: str  # the rule's choice before the row-length fallback
    n_bytes: int


@dataclass(frozen=True)
class QuantizeResult:
    path: Path
    file_type: str
    tensors: tuple[TensorReport, ...]
    n_bytes: int
    seconds: float


Progress = Callable[[int, int, TensorReport], None]


def open_source(path: str | os.PathLike[str]) -> Source:
    """An HF model directory or a GGUF file with F32/F16/BF16 tensors."""
    p = Path(path)
    if p.is_dir():
        return HFSource(p)
    if p.is_file():
        return GGUFSource(p)
    raise ModelNotFoundError(f"{p} is neither a model directory nor a GGUF file")


def quantize_model(
    src: str | os.PathLike[str], out: str | os.PathLike[str], file_type: str,
    progress: Progress | None = None,
) -> QuantizeResult:
    """Quantize an HF directory or an F32/F16/BF16 GGUF to `out` in llama.cpp's format.
    `file_type` is "q8_0", "q4_0" or "q4_k_m"; `progress(i, n, tensor)` follows each tensor
    (i from 1). A failure leaves no file at `out`."""
    ft = FILE_TYPES.get(file_type)
    if ft is None:
        raise InvalidParameterError("type", f"{file_type!r} is not one of {', '.join(FILE_TYPES)}")
    start = time.monotonic()
    out_path = Path(out)
    tmp = out_path.with_name(out_path.name + ".tmp")
    source = open_source(src)
    try:
        reports = _write_atomically(source, ft, tmp, out_path, progress)
    finally:
        source.close()
    return QuantizeResult(out_path, ft.name, reports, out_path.stat().st_size, time.monotonic() - start)


def _write_atomically(
    source: Source, ft: FileType, tmp: Path, out: Path, progress: Progress | None
) -> tuple[TensorReport, ...]:
    try:
        reports = _write(source, ft, tmp, progress)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return reports


def _write(source: Source, ft: FileType, path: Path, progress: Progress | None) -> tuple[TensorReport, ...]:
    planner = TypePlanner(ft, [t.name for t in source.tensors], _heads_per_kv_head(source))
    choices = [planner.choose(t.name, t.shape) for t in source.tensors]
    _log_fallbacks(choices)
    w = gguf.GGUFWriter(str(path), source.arch)
    try:
        source.write_metadata(w)
        w.add_file_type(ft.ftype)
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        for t, c in zip(source.tensors, choices):
            w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), encoded_nbytes(t.shape, c.qtype), raw_dtype=c.qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        return _write_tensors(w, source, choices, progress)
    finally:
        w.close()


def _heads_per_kv_head(source: Source) -> int:
    shapes = {t.name: t.shape for t in source.tensors}
    q, v = shapes.get("blk.0.attn_q.weight"), shapes.get("blk.0.attn_v.weight")
    return q[0] // v[0] if q and v and v[0] else 1


def _log_fallbacks(choices: list[Choice]) -> None:
    pairs = sorted({(c.wanted.name, c.qtype.name) for c in choices if c.qtype != c.wanted})
    if pairs:
        n = sum(c.qtype != c.wanted for c in choices)
        log.warning("%d tensors have rows that do not fit their type's block size; used %s (as llama.cpp does)",
                    n, ", ".join(f"{new} for {old}" for old, new in pairs))


def _write_tensors(
    w: gguf.GGUFWriter, source: Source, choices: list[Choice], progress: Progress | None
) -> tuple[TensorReport, ...]:
    reports: list[TensorReport] = []
    n = len(source.tensors)
    for t, c, data in _encoded(source, choices):
        w.write_tensor_data(data)
        report = TensorReport(t.name, t.shape, c.qtype.name, c.wanted.name, data.nbytes)
        reports.append(report)
        if progress is not None:
            progress(len(reports), n, report)
    if len(reports) != n:
        raise ModelFormatError(f"the source yielded {len(reports)} of its {n} tensors")
    return tuple(reports)


def _encoded(source: Source, choices: list[Choice]) -> Iterator[tuple[SourceTensor, Choice, np.ndarray]]:
    """Encoded tensors in file order. numpy releases the GIL in the block arithmetic, so a few
    tensors encode at once on threads; the window bounds how many sit in memory."""
    window = max(1, min(8, os.cpu_count() or 1))
    pending: deque = deque()
    with ThreadPoolExecutor(window) as pool:
        for t, c, (name, array) in zip(source.tensors, choices, source.arrays()):
            if name != t.name:
                raise ModelFormatError(f"the source yielded tensor {name!r} where {t.name!r} was planned")
            pending.append((t, c, pool.submit(_encode, t, array, c)))
            if len(pending) >= window:
                t0, c0, fut = pending.popleft()
                yield t0, c0, fut.result()
        while pending:
            t0, c0, fut = pending.popleft()
            yield t0, c0, fut.result()


def _encode(t: SourceTensor, array: np.ndarray, c: Choice) -> np.ndarray:
    if array.shape != t.shape:
        raise ModelFormatError(f"tensor {t.name!r} has shape {array.shape}, its header says {t.shape}")
    if not np.all(np.isfinite(array)):
        raise ModelFormatError(f"tensor {t.name!r} holds NaN or infinity")
    return encode(array, c.qtype)
