"""The report's pages: the protocol leaderboards, robustness, costs, sweeps and prediction panels,
with every family's sections, in one HTML file (and md/csv/json/tex tables); the `cryocube report`
command. The parts they are made of (tables, figures, statistics) are `cryocube.report`'s.

    from cryocube.pages import build_report
    rep = build_report("runs/", "report-out")    # tables (md/csv/json/tex), figures, report.html
    build_report(None, "paper", published=True)  # the paper's table, re-checked

Names are imported on first use, so `cryocube --help` does not pay for matplotlib.
"""

from ..plugins import lazy_exports

_EXPORTS = {
    "build": ("Report", "ReportError", "build_report"),
    "qualitative": ("qualitative_panels",),
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
