"""The report's pages (protocol leaderboards, robustness, costs, sweeps, prediction panels, every
family's sections) and `cryocube report`; names load on first use (`--help` skips matplotlib)."""

from ..plugins import lazy_exports

_EXPORTS = {
    "build": ("Report", "ReportError", "build_report"),
    "qualitative": ("qualitative_panels",),
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
