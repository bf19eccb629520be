"""The report's uncertainty (issue 39), figures printed.

1. Time: the report of the 192-run grid (4 models x 4 datasets x 4 protocols x 3 seeds, 96 tiles on
   12 scenes per run, records and per-tile files written as the segmentation family writes them)
   with 2,000 bootstrap draws, all formats; the bootstrap part (every interval, aggregate and
   probability of improvement) timed apart from the whole report (tables, figures, HTML).
2. Coverage (docs/statistics.md): the share of 1,000 simulated test sets whose nominal 95 % interval
   covers the true mIoU, for the scene bootstrap and the tile bootstrap, on independent and on
   scene-correlated tiles, at 2, 5, 10, 20 and 30 scenes (10 tiles per scene).

    python benchmarks/bench_statistics.py            # both
    python benchmarks/bench_statistics.py --time     # only the grid report
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def time_grid(draws: int) -> None:
    from test_statistics import write_grid

    from cryocube.pages.build import build_report, group_runs
    from cryocube.report import intervals
    from cryocube.report.leaderboard import leaderboard_from_runs
    from cryocube.report.records import load_results

    with tempfile.TemporaryDirectory() as tmp:
        n = write_grid(Path(tmp) / "results")
        clock = lambda: (time.perf_counter(), time.process_time())  # noqa: E731
        t0 = clock()
        res = load_results(Path(tmp) / "results")
        t1 = clock()
        for (proto, frac), runs in group_runs(res.runs).items():
            lb = leaderboard_from_runs(runs, key=proto, title=proto, protocol=proto, fraction=frac)
            intervals.board_intervals(lb, runs, draws=draws)
        t2 = clock()
        build_report(res, Path(tmp) / "report", draws=draws)
        t3 = clock()
    span = lambda a, b: f"{b[0] - a[0]:.2f} s wall, {b[1] - a[1]:.2f} s CPU"  # noqa: E731
    print(
        f"grid of {n} runs, {draws} draws: read {span(t0, t1)}; every interval {span(t1, t2)};"
        f" whole report (all formats, figures, HTML; intervals included) {span(t2, t3)};"
        f" load average {os.getloadavg()[0]:.1f} on {len(os.sched_getaffinity(0))} cores"
    )


def coverage_table(sets: int = 1000, draws: int = 1000) -> None:
    from test_statistics import K, coverage, simulate

    rng = np.random.default_rng(39)
    print(f"coverage of the nominal 95 % interval, {sets} test sets, {draws} draws each:")
    print("scenes | tiles | scene bootstrap: independent, correlated | tile bootstrap: same")
    for scenes in (2, 5, 10, 20, 30):
        row = []
        for unit in ("scene", "tile"):
            for conc in (None, 20.0):
                cms = simulate(rng, sets, scenes, 10, conc)
                units = cms.sum(2) if unit == "scene" else cms.reshape(sets, -1, K, K)
                row.append(coverage(units, rng, draws))
        print(f"{scenes:6d} | {scenes * 10:5d} | " + " | ".join(f"{c:.3f}" for c in row))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--time", action="store_true", help="only the grid report's timing")
    ap.add_argument("--draws", type=int, default=2000)
    a = ap.parse_args(argv)
    time_grid(a.draws)
    if not a.time:
        coverage_table()


if __name__ == "__main__":
    main()
