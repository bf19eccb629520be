"""Reports: leaderboards as in the Cryo-Bench paper, robustness over seeds, costs, plots, HTML.

    from cryocube.report import build_report
    rep = build_report("runs/", "report-out")    # tables (md/csv/json/tex), figures, report.html
    build_report(None, "paper", published=True)  # the paper's table, re-checked

Names are imported on first use, so `cryocube --help` does not pay for matplotlib.
"""

from ..plugins import lazy_exports

_EXPORTS = {
    "build": ("Report", "ReportError", "build_report", "render_published"),
    "leaderboard": (
        "Leaderboard",
        "best_two",
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
    "qualitative": ("qualitative_panels",),
    "records": ("Results", "ResultsError", "Run", "load_results"),
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
