"""Quantize a model to a GGUF file llama.cpp can load: `quantize_model(src, out, type)`.

numpy only (no torch). Q8_0/Q4_0/Q5_0 blocks come from gguf-py; Q4_K/Q6_K from kquants.py;
the per-tensor type mix follows llama.cpp's rules (mix.py).
"""
from mlxr.quantize.mix import FILE_TYPES
from mlxr.quantize.quantizer import QuantizeResult, TensorReport, quantize_model

__all__ = ["FILE_TYPES", "QuantizeResult", "TensorReport", "quantize_model"]
