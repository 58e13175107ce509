"""bench/'s folders on sys.path, so a script in any of them imports the shared modules (common,
latency, throughput, ...) and the scripts of the other folders by their bare names, as it did
when every script lay in bench/. Imported by each folder's bench_path.py."""
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
# The folders whose modules other scripts import; probes/ only imports, so it stays off the path.
SHARED = (BENCH, BENCH / "kernels", BENCH / "peers", BENCH / "gpu")

for folder in reversed(SHARED):
    if str(folder) not in sys.path:
        sys.path.insert(1, str(folder))  # after the script's own folder
