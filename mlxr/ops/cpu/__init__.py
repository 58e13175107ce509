"""The CPU's native-code machinery shared by every op folder: building and loading each op's C
kernels (cpu_build.py) and the recorded forward replayed without Python (cpu_plan.py)."""
