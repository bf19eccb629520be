"""Wall-time estimate of a plan (`evaluate --dry-run --budget FILE`), with the reference's beside
it.

The unit costs come from a measured budget: `benchmarks/bench_reference.py --budget-out FILE` runs
one frozen run of cryocube and of the real Cryo-Bench code on this machine and writes them (seconds
per encoder window, per decoder step, per decoder window, fixed costs). A plan's runs are then
summed from their planned steps, validations, windows and encoder items, the encoder costs scaled by
the model's catalogued GFLOPs against the measured model's. cryocube's figure counts each feature
cache once (every run on it shares it) and the runs one after the other on all cores; the
reference's is its scripts' way, one run at a time, the encoder re-run in every step and every
validation. Segmentation runs only.
"""

from __future__ import annotations

import json

from ..errors import UserError

BUDGET_VERSION = 1
CC_KEYS = (
    "startup_s",
    "fit_setup_s",
    "encoder_s_per_item",
    "step_s",
    "decoder_window_s",
    "test_fixed_s",
)
REF_KEYS = (
    "setup_s",
    "encoder_s_per_item",
    "decoder_step_s",
    "decoder_window_s",
    "train_encoder_s_per_item",
)


def load_budget(path: str) -> dict:
    """A budget file written by bench_reference.py; one sentence naming the file and field when it
    is not one."""
    try:
        with open(path) as f:
            b = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(
            f"--budget {path}: cannot read a JSON budget ({type(e).__name__}: {e}); write one with "
            "`python benchmarks/bench_reference.py --budget-out FILE`"
        ) from None
    if not isinstance(b, dict) or b.get("version") != BUDGET_VERSION:
        raise UserError(
            f"--budget {path}: not a version-{BUDGET_VERSION} budget of"
            " benchmarks/bench_reference.py"
        )
    for side, keys in (("cryocube", CC_KEYS), ("reference", REF_KEYS)):
        for k in keys:
            v = (b.get(side) or {}).get(k)
            if not isinstance(v, (int, float)) or v < 0:
                raise UserError(
                    f"--budget {path}: field {side}.{k} must be a number >= 0, got {v!r}"
                )
    for k in ("encoder_gflops", "batch_size"):
        if not isinstance(b.get(k), (int, float)) or b[k] <= 0:
            raise UserError(f"--budget {path}: field {k} must be a number > 0, got {b.get(k)!r}")
    return b


def estimate(planned: list, budget: dict) -> dict:
    """{"cryocube_s", "reference_s", "runs", "skipped"} for the segmentation runs of `planned`."""
    cc, ref = budget["cryocube"], budget["reference"]
    g0 = float(budget["encoder_gflops"])
    total_cc, total_ref, runs, skipped = float(cc["startup_s"]), 0.0, 0, 0
    caches: set[str] = set()
    for p in planned:
        w = p.work
        if p.family != "segmentation":
            skipped += 1
            continue
        e = p.estimate
        scale = float(w.encoder.model.gflops or g0) / g0
        bs = w.recipe.batch_size
        val_w = int(w.val_samples.size) * e["windows_per_tile"]
        test_w = int(w.test_samples.size) * e["windows_per_tile"]
        steps, vals = e["steps"], e["validations"]
        enc = cc["encoder_s_per_item"] * scale
        # forward + backward of the encoder in every step, encoder + decoder on every window
        if w.trains_encoder:
            total_cc += (
                cc["fit_setup_s"]
                + steps * (cc["step_s"] + 3 * bs * enc)
                + (vals * val_w + test_w) * (cc["decoder_window_s"] + enc)
                + cc["test_fixed_s"]
            )
        else:
            if p.prep_key not in caches:
                caches.add(p.prep_key)
                total_cc += e["encoder_items"] * enc
            total_cc += (
                cc["fit_setup_s"]
                + steps * cc["step_s"]
                + (vals * val_w + test_w) * cc["decoder_window_s"]
                + cc["test_fixed_s"]
            )
        renc = ref["encoder_s_per_item"] * scale
        train_enc = (ref["train_encoder_s_per_item"] * scale * 3) if w.trains_encoder else renc
        total_ref += (
            ref["setup_s"]
            + steps * (ref["decoder_step_s"] + bs * train_enc)
            + (vals * val_w + test_w) * (ref["decoder_window_s"] + renc)
        )
        runs += 1
    return {
        "cryocube_s": total_cc if runs else 0.0,
        "reference_s": total_ref,
        "runs": runs,
        "skipped": skipped,
    }


def hms(s: float) -> str:
    """Seconds as '1h05m' from an hour on, else '4m07s': a dry-run estimate needs no finer."""
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def estimate_text(planned: list, budget: dict, path: str) -> str:
    """The line `evaluate --dry-run --budget` prints: both wall times, their ratio and where the
    budget was measured."""
    est = estimate(planned, budget)
    m = budget.get("machine", {})
    where = (
        f"measured {budget.get('date', '?')} on {m.get('cpu', '?')} ({m.get('cores', '?')} cores)"
    )
    extra = f"; {est['skipped']} runs of other families not estimated" if est["skipped"] else ""
    ratio = est["reference_s"] / est["cryocube_s"] if est["cryocube_s"] else float("nan")
    return (
        f"estimated wall time of {est['runs']} segmentation runs: cryocube"
        f" {hms(est['cryocube_s'])}, the reference (one run at a time, as its scripts run)"
        f" {hms(est['reference_s'])}, {ratio:.1f}x; from the budget {path} ({where}){extra}"
    )
