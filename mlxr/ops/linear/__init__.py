"""Dense (unquantized) matrix products: the dispatcher and torch path (linear.py) and the Triton
kernels it picks for decode, the 16-bit/FP8 GEMV (gemv_triton.py) and the batched-decode product
(gemm_rows_triton.py)."""
