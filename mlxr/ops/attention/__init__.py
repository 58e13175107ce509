"""Paged attention: the metadata every attention op reads (attn_metadata.py), the dispatcher and
torch references (paged_attention.py), the Triton decode and prefill kernels over shared tiles
(paged_*_triton.py, attention_tiles_triton.py), and the C kernels (attention.c: decode, and the
rotary + K/V write that rotary/ calls; loaded by attention_cpu.py)."""
