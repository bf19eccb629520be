"""Wall-time estimate of a plan's segmentation runs, the reference's beside it, from unit costs
measured by benchmarks/bench_reference.py (`evaluate --dry-run --budget FILE`, docs/usage.md)."""

from __future__ import annotations

import contextlib
import json
import math

from ..errors import UserError

BUDGET_VERSION = 2
READS = (1, 2)  # version 1: one frozen ViT-S unit at the top level
_SHARES = ("step_encoder_share", "window_encoder_share")
_COMMON = ("startup_s", "fit_setup_s", "encoder_s_per_item", "step_s")
_REF1 = ("setup_s", "encoder_s_per_item", "decoder_step_s", "decoder_window_s")
KEYS = {  # the fields of each side of a unit, by budget version
    1: {
        "cryocube": (*_COMMON, "decoder_window_s", "test_fixed_s"),
        "reference": (*_REF1, "train_encoder_s_per_item"),
    },
    2: {
        "cryocube": (*_COMMON, "window_s", "test_fixed_s", *_SHARES),
        "reference": ("setup_s", "step_s", "window_s", *_SHARES),
    },
}
CLASSES = ("S", "B", "L", "Swin")
KINDS = ("frozen", "finetune")


def size_class(spec) -> str:
    """S, B, L or Swin: Swin by architecture, ViTs by width (384/768/1024), else by parameters."""
    if "swin" in spec.architecture:
        return "Swin"
    d = (spec.arch or {}).get("embed_dim")
    if isinstance(d, int):
        return "S" if d <= 384 else "B" if d <= 768 else "L"
    p = spec.params_m
    return "B" if p is None else "S" if p < 50 else "B" if p < 200 else "L"


def _number(v, path: str, field: str, positive: bool = False) -> None:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0 or (positive and v <= 0):
        raise UserError(
            f"--budget {path}: field {field} must be a number {'> 0' if positive else '>= 0'},"
            f" got {v!r}"
        )


def _check_unit(u: dict, path: str, where: str, version: int) -> None:
    """Every cost of a unit (at `where` in the file) a number >= 0, its GFLOPs and batch > 0."""
    for side, keys in KEYS[version].items():
        for k in keys:
            _number((u.get(side) or {}).get(k), path, f"{where}{side}.{k}")
    for k in ("encoder_gflops", "batch_size"):
        _number(u.get(k), path, f"{where}{k}", positive=True)


def _v1_unit(b: dict) -> dict:
    """The one frozen unit of a version-1 budget in version 2's terms."""
    cc, ref, bs = b["cryocube"], b["reference"], float(b["batch_size"])
    rstep = ref["decoder_step_s"] + bs * ref["train_encoder_s_per_item"]
    rwin = ref["decoder_window_s"] + ref["encoder_s_per_item"]
    return {
        "model": (b.get("measured_with") or {}).get("model", "?"),
        "encoder_gflops": b["encoder_gflops"],
        "batch_size": b["batch_size"],
        "date": b.get("date", "?"),
        "cryocube": {k: cc[k] for k in (*_COMMON, "test_fixed_s")}
        | {"window_s": cc["decoder_window_s"], **dict.fromkeys(_SHARES, 0.0)},
        "reference": {
            "setup_s": ref["setup_s"],
            "step_s": rstep,
            "window_s": rwin,
            "step_encoder_share": bs * ref["train_encoder_s_per_item"] / rstep if rstep else 0.0,
            "window_encoder_share": ref["encoder_s_per_item"] / rwin if rwin else 0.0,
        },
    }


def units_of(budget: dict) -> dict:
    """The units by "class/protocol" (version 1: its frozen unit, at its model's class)."""
    if "units" in budget:
        return budget["units"]
    cls = "S"
    if model := (budget.get("measured_with") or {}).get("model"):
        from ..models import model_spec

        with contextlib.suppress(UserError):  # a model this install does not know: GFLOPs scale
            cls = size_class(model_spec(model))
    return {f"{cls}/frozen": _v1_unit(budget)}


def load_budget(path: str) -> dict:
    """A budget file of bench_reference.py as version 2, or one sentence naming file and field."""
    try:
        with open(path) as f:
            b = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(
            f"--budget {path}: cannot read a JSON budget ({type(e).__name__}: {e}); write one with "
            "`python benchmarks/bench_reference.py --budget-out FILE`"
        ) from None
    if not isinstance(b, dict) or b.get("version") not in READS:
        raise UserError(
            f"--budget {path}: not a version-{BUDGET_VERSION} (or 1) budget of"
            " benchmarks/bench_reference.py"
        )
    if b["version"] == 1:
        _check_unit(b, path, "", 1)
        return {**b, "units": units_of(b)}
    units = b.get("units")
    if not isinstance(units, dict) or not units:
        raise UserError(f"--budget {path}: field units must name at least one measured unit")
    from ..models import list_models

    names = {*CLASSES, *list_models()}  # a unit stands for a size class or one model
    for key, u in units.items():
        cls, _, kind = str(key).partition("/")
        if cls not in names or kind not in KINDS:
            raise UserError(
                f"--budget {path}: unit {key!r} is not <class>/<protocol> or <model>/<protocol>"
                f" with class one of {', '.join(CLASSES)}, model one of `cryocube list models`"
                f" and protocol one of {', '.join(KINDS)}"
            )
        if not isinstance(u, dict):
            raise UserError(f"--budget {path}: unit {key} must be an object")
        _check_unit(u, path, f"units.{key}.", 2)
    return b


def _scaled(x: float, share: float, scale: float) -> float:
    """A cost whose encoder share scales by `scale` (GFLOPs against the measured model's)."""
    return x * (share * scale + 1.0 - share)


def unit_class(key: str) -> str:
    """The size class a unit stands for: its key's, or its model's (a per-model unit)."""
    name = key.split("/")[0]
    if name in CLASSES:
        return name
    from ..models import model_spec

    return size_class(model_spec(name))


def _unit_for(units: dict, model: str, cls: str, kind: str, gflops: float | None) -> str:
    """The unit a run is costed at: its model's own, else its class's (by key, or the measured
    model of that class nearest in GFLOPs), else the nearest of its protocol, else frozen."""
    if f"{model}/{kind}" in units:
        return f"{model}/{kind}"
    if f"{cls}/{kind}" in units:
        return f"{cls}/{kind}"
    g = gflops or 1.0

    def nearest(keys: list[str]) -> str:
        return min(keys, key=lambda k: abs(math.log(g / units[k]["encoder_gflops"])))

    if same := [k for k in units if k.endswith(f"/{kind}") and unit_class(k) == cls]:
        return nearest(same)
    for k in (kind, "frozen"):
        if cands := [key for key in units if key.endswith(f"/{k}")]:
            return nearest(cands)
    return next(iter(units))


def run_costs(p, units: dict) -> dict:
    """One segmentation run's seconds, by `key` (class/protocol) and `unit` (the one used); cc's
    `shared` is its feature cache's extraction, paid once per cache."""
    w, e = p.work, p.estimate
    kind = "finetune" if w.trains_encoder else "frozen"
    cls = size_class(w.encoder.model)
    key = _unit_for(units, w.encoder.model.id, cls, kind, w.encoder.model.gflops)
    u = units[key]
    how = "measured" if u.get("model") == w.encoder.model.id else "scaled"
    cc, ref = u["cryocube"], u["reference"]
    scale = float(w.encoder.model.gflops or u["encoder_gflops"]) / float(u["encoder_gflops"])
    bsr = w.recipe.batch_size / float(u["batch_size"])
    tiles = e["validations"] * int(w.val_samples.size) + int(w.test_samples.size)
    windows, steps = tiles * e["windows_per_tile"], e["steps"]
    enc = cc["encoder_s_per_item"] * scale
    r_window = _scaled(ref["window_s"], ref["window_encoder_share"], scale)
    if kind == "finetune" and key.endswith("/frozen"):
        # no fine-tuning unit: the encoder's inference x3 (forward + backward) in every step
        bs = w.recipe.batch_size
        step = cc["step_s"] * bsr + 3 * bs * enc
        window = cc["window_s"] + enc
        r_enc = ref["window_s"] * ref["window_encoder_share"] * scale
        r_step = ref["step_s"] * (1 - ref["step_encoder_share"]) * bsr + 3 * bs * r_enc
    else:
        step = _scaled(cc["step_s"], cc["step_encoder_share"], scale) * bsr
        window = _scaled(cc["window_s"], cc["window_encoder_share"], scale)
        r_step = _scaled(ref["step_s"], ref["step_encoder_share"], scale) * bsr
    return {
        "key": f"{cls}/{kind}",
        "unit": key,
        "how": how,
        "cc": {
            "shared": 0.0 if w.trains_encoder else e["encoder_items"] * enc,
            "own": cc["fit_setup_s"] + steps * step + windows * window + cc["test_fixed_s"],
        },
        "ref": ref["setup_s"] + steps * r_step + windows * r_window,
    }


def estimate(planned: list, budget: dict) -> dict:
    """Both sides' seconds for the segmentation runs of `planned`, in total and by class/protocol
    (`groups`, each with the unit it came from)."""
    units = units_of(budget)
    startup = min(u["cryocube"]["startup_s"] for u in units.values())
    caches: set[str] = set()
    groups: dict[str, dict] = {}
    runs = [p for p in planned if p.family == "segmentation"]
    for p in runs:
        c = run_costs(p, units)
        cc = c["cc"]["own"]
        if p.prep_key is not None and p.prep_key not in caches:
            caches.add(p.prep_key)
            cc += c["cc"]["shared"]
        g = groups.setdefault(
            c["key"], {"runs": 0, "cryocube_s": 0.0, "reference_s": 0.0, "units": {}}
        )
        g["runs"] += 1
        src = f"{c['how']} {c['unit']}"  # runs by the unit they were costed at, and how
        g["units"][src] = g["units"].get(src, 0) + 1
        g["cryocube_s"] += cc
        g["reference_s"] += c["ref"]
    return {
        "cryocube_s": startup + sum(g["cryocube_s"] for g in groups.values()) if runs else 0.0,
        "reference_s": sum(g["reference_s"] for g in groups.values()),
        "runs": len(runs),
        "skipped": len(planned) - len(runs),
        "groups": groups,
    }


def hms(s: float) -> str:
    """Seconds as '1h05m' from an hour on, else '4m07s': a dry-run estimate needs no finer."""
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def estimate_text(planned: list, budget: dict, path: str) -> str:
    """Both wall times and their ratio, then a line per class/protocol naming its unit."""
    est = estimate(planned, budget)
    m = budget.get("machine", {})
    extra = f"; {est['skipped']} runs of other families not estimated" if est["skipped"] else ""
    ratio = est["reference_s"] / est["cryocube_s"] if est["cryocube_s"] else float("nan")
    lines = [
        f"estimated wall time of {est['runs']} segmentation runs: cryocube"
        f" {hms(est['cryocube_s'])}, the reference (one run at a time, as its scripts run)"
        f" {hms(est['reference_s'])}, {ratio:.1f}x; from the budget {path} (measured"
        f" {budget.get('date', '?')} on {m.get('cpu', '?')} ({m.get('cores', '?')} cores)){extra}"
    ]
    units = units_of(budget)
    for key in sorted(est["groups"], key=lambda k: (KINDS.index(k.split("/")[1]), k)):
        g = est["groups"][key]
        srcs = []
        for src, n in sorted(g["units"].items()):
            how, unit = src.split(" ", 1)
            model = units[unit].get("model", "?")
            srcs.append(
                f"measured ({model})"
                if how == "measured"
                else f"SCALED from {unit} ({model}) by encoder GFLOPs"
            )
            srcs[-1] += f" ({n} runs)" if len(g["units"]) > 1 else ""
        r = g["reference_s"] / g["cryocube_s"] if g["cryocube_s"] else float("nan")
        lines.append(
            f"  {key:<13} {g['runs']:>3} runs: cryocube {hms(g['cryocube_s'])}, reference"
            f" {hms(g['reference_s'])}, {r:.1f}x; unit {'; '.join(srcs)}"
        )
    return "\n".join(lines)
