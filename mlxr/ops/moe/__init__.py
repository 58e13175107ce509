"""The fused mixture-of-experts MLP on CUDA (moe_triton.py); mlxr/layers/moe.py holds the torch
path and calls it."""
