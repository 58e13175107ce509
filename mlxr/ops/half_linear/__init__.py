"""Float16 weights against a few float32 rows on the CPU: the C kernel (half_linear.c, loaded by
half_linear_cpu.py) that mlxr/layers/linear.py's StoredLinear runs for decode-sized steps."""
