"""RMSNorm (+ residual add): the dispatcher and torch reference (rms_norm.py), the Triton kernel
(rms_norm_triton.py) and the C kernel (norm.c, loaded by norm_cpu.py)."""
