"""Which ggml type each tensor gets, following llama.cpp's llama_tensor_get_type rules for
the file types we write (Q8_0, Q4_0, Q4_1, Q6_K, Q5_K_M, Q4_K_M, Q3_K_M, Q2_K), for dense
models outside Falcon (the MoE and Falcon variants of the rules are not implemented)."""
from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

from gguf.constants import GGMLQuantizationType, LlamaFileType

from mlxr.quantize.encode import block_size

Q = GGMLQuantizationType
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FileType:
    name: str  # the CLI spelling
    ftype: LlamaFileType
    default: GGMLQuantizationType


FILE_TYPES: dict[str, FileType] = {
    "q8_0": FileType("q8_0", LlamaFileType.MOSTLY_Q8_0, Q.Q8_0),
    "q4_0": FileType("q4_0", LlamaFileType.MOSTLY_Q4_0, Q.Q4_0),
    "q4_1": FileType("q4_1", LlamaFileType.MOSTLY_Q4_1, Q.Q4_1),
    "q6_k": FileType("q6_k", LlamaFileType.MOSTLY_Q6_K, Q.Q6_K),
    "q5_k_m": FileType("q5_k_m", LlamaFileType.MOSTLY_Q5_K_M, Q.Q5_K),
    "q4_k_m": FileType("q4_k_m", LlamaFileType.MOSTLY_Q4_K_M, Q.Q4_K),
    "q3_k_m": FileType("q3_k_m", LlamaFileType.MOSTLY_Q3_K_M, Q.Q3_K),
    "q2_k": FileType("q2_k", LlamaFileType.MOSTLY_Q2_K, Q.Q2_K),
}
# llama.cpp's substitutes for a K-quant whose rows are not a multiple of 256.
_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q6_K: Q.Q8_0, Q.Q5_K: Q.Q5_1, Q.Q3_K: Q.IQ4_NL, Q.Q2_K: Q.IQ4_NL}
_LAYER = re.compile(r"blk\.(\d+)\.")
_KEEP_F32_NAMES = ("rope_freqs.weight",)


@dataclass(frozen=True)
class Choice:
    qtype: GGMLQuantizationType
    wanted: GGMLQuantizationType  # before the row-length fallback; == qtype when none applied


def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp: the first and last eighth of the layers, and every third one between."""
    eighth = n_layers // 8
    return layer < eighth or layer >= 7 * n_layers // 8 or (layer - eighth) % 3 == 2


class TypePlanner:
    """Per-tensor types for one model, given every tensor's GGUF name up front (the
    layer-position rules need the layer counts, the output rule whether output.weight exists)."""

    def __init__(self, file_type: FileType, names: Sequence[str], n_gqa: int = 1) -> None:
        self.file_type = file_type
        self.n_gqa = n_gqa  # attention heads per KV head (Q2_K's attn_v rule)
        self.has_output = "output.weight" in names
        self.n_attn_v = sum(1 for n in names if n.endswith("attn_v.weight"))
        self.n_ffn_down = sum(1 for n in names if n.endswith("ffn_down.weight"))

    def choose(self, name: str, shape: tuple[int, ...]) -> Choice:
        if len(shape) < 2 or name.endswith("_norm.weight") or name in _KEEP_F32_NAMES:
            return Choice(Q.F32, Q.F32)  # llama.cpp quantizes 2-D weights only
        wanted = self._preferred(name)
        qtype = _fit_row(wanted, shape[-1])
        if qtype != wanted:
            log.info("%s: row length %d is not a multiple of %d, using %s instead of %s",
                        name, shape[-1], block_size(wanted), qtype.name, wanted.name)
        return Choice(qtype, wanted)

    def _preferred(self, name: str) -> GGMLQuantizationType:
        default = self.file_type.default
        is_output = name == "output.weight" or (not self.has_output and name == "token_embd.weight")
        if is_output:
            return default if default == Q.Q8_0 else Q.Q6_K
        ftype = self.file_type.ftype
        if ftype in (LlamaFileType.MOSTLY_Q4_K_M, LlamaFileType.MOSTLY_Q5_K_M):
            more = _MORE_BITS_KIND.get(_kind(name))
            if more and use_more_bits(_layer(name), getattr(self, more)):
                return Q.Q6_K
            return default
        if ftype == LlamaFileType.MOSTLY_Q3_K_M:
            return self._q3_k_m(name, default)
        if ftype == LlamaFileType.MOSTLY_Q2_K:
            kind = _kind(name)
            if kind == "attn_v":
                return Q.Q4_K if self.n_gqa >= 4 else Q.Q3_K
            return Q.Q3_K if kind in ("ffn_down", "attn_output") else default
        return default

    def _q3_k_m(self, name: str, default: GGMLQuantizationType) -> GGMLQuantizationType:
        kind, layer = _kind(name), _layer(name)
        if kind == "attn_v":
            return Q.Q5_K if layer < 2 else Q.Q4_K
        if kind == "ffn_down":
            return Q.Q5_K if layer < self.n_ffn_down // 16 else Q.Q4_K
        return Q.Q4_K if kind == "attn_output" else default


def _fit_row(qtype: GGMLQuantizationType, row: int) -> GGMLQuantizationType:
    if row % block_size(qtype) == 0:
        return qtype
    substitute = _FALLBACK.get(qtype, Q.F16)
    return substitute if row % block_size(substitute) == 0 else Q.F16


_MORE_BITS_KIND = {"attn_v": "n_attn_v", "ffn_down": "n_ffn_down"}


def _kind(name: str) -> str:
    """"attn_v", "ffn_down", ... of "blk.N.attn_v.weight"."""
    return _LAYER.sub("", name).removesuffix(".weight")


def _layer(name: str) -> int:
    match = _LAYER.match(name)
    return int(match.group(1)) if match else 0
