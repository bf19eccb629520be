"""The report's parts, below the families that write their sections with them: the records reader,
leaderboards and ranks, statistics and intervals, tables, figures, the HTML writer, the board and
the paper's published table. The pages that assemble them are `cryocube.pages`.

Names are imported on first use, so `cryocube --help` does not pay for matplotlib.
"""

from ..plugins import lazy_exports

_EXPORTS = {
    "leaderboard": (
        "Leaderboard",
        "build_leaderboard",
        "competition_ranks",
        "leaderboard_from_runs",
        "stability_q",
    ),
    "published": (
        "PUBLISHED_CSV",
        "Mismatch",
        "check_consistency",
        "load_leaderboard_csv",
        "published_leaderboard",
    ),
    "records": ("Results", "ResultsError", "Run", "load_results"),
    "tables": ("best_two",),
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
