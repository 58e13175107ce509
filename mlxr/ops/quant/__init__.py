"""Weights kept in their GGUF (or bitsandbytes NF4) blocks, one folder for every piece of a type:
its geometry (quant_types.py), the dispatcher (quant.py; extra types through quant_extra.py),
the torch references exact to gguf-py (quant_reference*.py), the C kernels (quant.c for the core
types with its AVX-512/AVX2/portable paths in quant_generic.h, quant_extra.c; half.h, pool.h)
with their ctypes launchers (quant_cpu.py), and the Triton kernels (quant_triton.py over
quant_blocks_triton.py, the word-stream GEMV quant_wgemv*_triton.py, quant_extra_triton.py with
its Q4_1 tiles in quant_q4_1_triton.py)."""
