"""Run every benchmark (pass --short for the quick setting) and print their figures."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
BENCHMARKS = [
    "bench_convert",
    "bench_engine",
    "bench_models",
    "bench_profile",
    "bench_tune",
    "bench_vlm",
]

if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a == "--short"]
    for name in BENCHMARKS:
        print(f"== {name} {' '.join(args)}", flush=True)
        importlib.import_module(name).main(args)
