"""The report's parts, below the families that write their sections with them (the pages that
assemble them: `cryocube.pages`); names load on first use (`--help` skips matplotlib)."""

from ..plugins import lazy_exports

_EXPORTS = {
    "leaderboard": ("competition_ranks", "stability_q"),
    "published": (
        "PUBLISHED_CSV",
        "check_consistency",
        "load_leaderboard_csv",
        "published_leaderboard",
    ),
    "records": ("load_results",),
    "tables": ("best_two",),
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
