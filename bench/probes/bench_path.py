"""Puts bench/ on sys.path, so a probe run as `python bench/probes/x.py` imports bench's shared
modules (common, latency, throughput) as the scripts beside them do."""
import sys
from pathlib import Path

BENCH = str(Path(__file__).resolve().parent.parent)
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)
