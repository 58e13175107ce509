"""bench/kernels/quant_gemm_table.py --merge: a run measuring some shapes keeps the others."""
import argparse
import importlib
import sys
from pathlib import Path

BENCH_KERNELS = Path(__file__).resolve().parents[2] / "bench" / "kernels"


def _script():
    sys.path.insert(0, str(BENCH_KERNELS))
    try:
        return importlib.import_module("quant_gemm_table")
    finally:
        sys.path.remove(str(BENCH_KERNELS))


def test_a_merged_table_replaces_the_measured_cells_and_keeps_the_rest():
    qt = _script()
    cell = {"config": None, "best_us": 2.0, "dequant_us": 2.0, "path": "dequant"}
    kept = {"rows": [32, 64], "types": {
        "Q4_K": [{**cell, "n": 256, "k": 2048, "m": 32}, {**cell, "n": 4096, "k": 4096, "m": 32}],
        "Q8_0": [{**cell, "n": 256, "k": 2048, "m": 64}]}}
    new = {**cell, "type": "Q4_K", "n": 4096, "k": 4096, "m": 32, "path": "repacked", "config": {"bm": 32}}
    a = argparse.Namespace(types=["Q4_K"], rows=[32], margin=0.0)
    table = qt._table([new], a, None, "cpu", kept)
    assert [(c["n"], c["path"]) for c in table["types"]["Q4_K"]] == [(256, "dequant"), (4096, "repacked")]
    assert table["types"]["Q8_0"] == kept["types"]["Q8_0"]  # a type this run did not measure
    assert table["rows"] == [32, 64]
    alone = qt._table([new], a, None, "cpu", None)
    assert list(alone["types"]) == ["Q4_K"] and len(alone["types"]["Q4_K"]) == 1
