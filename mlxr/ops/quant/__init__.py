"""Weights kept in their GGUF (or bitsandbytes NF4) blocks, one folder for every piece of a type:
its geometry (block_types.py), the dispatcher (quant.py; extra types through extra.py),
the torch references exact to gguf-py (reference*.py), the C kernels (quant.c for the core
types with its AVX-512/AVX2/portable paths in quant_generic.h, quant_extra.c; half.h, pool.h)
with their ctypes launchers (cpu.py), and the Triton kernels (core_triton.py over
blocks_triton.py, the word-stream GEMV wgemv*_triton.py, extra_triton.py with
its Q4_1 tiles in q4_1_triton.py)."""
