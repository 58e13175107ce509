"""The gated delta rule and its short causal convolution: torch references (delta_rule.py), the
dispatcher (dispatch.py), the Triton kernels (delta_rule_triton.py) and the C kernels
(delta_rule.c, loaded by delta_rule_cpu.py)."""
