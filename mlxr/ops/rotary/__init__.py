"""Rotary position embeddings: the dispatcher and torch references (rotary.py, also the fused
rotary + K/V write), the Triton kernel (rotary_triton.py) and the fused QKV GEMV + rotary +
K/V write of decode (qkv_rope_triton.py). On CPU the fused write is attention.c's kernel
(attention/attention_cpu.py)."""
