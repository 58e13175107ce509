"""Puts bench/ and its shared folders on sys.path (bench/bench_folders.py), so a script run as
`python bench/<folder>/x.py` imports bench's shared modules (common, latency, throughput, ...)."""
import sys
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
import bench_folders  # noqa: E402,F401
