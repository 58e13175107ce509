"""Sampling's tensor math: logit processors, filters and the random draw (sampling.py), and the
structured-output token bitmask, in torch there and in one Triton kernel (bitmask_triton.py)."""
