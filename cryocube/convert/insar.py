"""Interferogram pairs -> one sample cube (docs/insar-cube.md); the GeoTIFF layout users have after
processing.

`PairReader` is the shared part of every interferogram layout: task targets, the deformation box and
free-text answers per pair, assembled into a `samples.SamplePlan` on the client *before any cluster
starts* (so every bad file, pair or field is one sentence first), then written by the shared
sample-cube writer. Which quantity feeds which task, which tasks a layout cannot serve and the
derivation parameters are catalog options (`targets`, `unavailable`, `derive`). `InSARReader` reads
`<pair>/{wrapped_phase,coherence[,unwrapped_phase]}.tif` + `annotation.json` and derives labels with
`insar_labels`; `hephaestus.py` reads the Hephaestus PNG layout.
"""

from __future__ import annotations

import dataclasses
import json
import math
import posixpath
import re
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import store as _store
from ..cube import _text
from ..cube.schema import declared
from .base import ConvertError, register
from .insar_labels import MASK_IGNORE, RULES_TEXT, Rules, derive
from .rawio import map_threads, raster_header, read_raster, write_geotiff
from .samples import SamplePlan, SampleReader

DATE = r"(\d{4}-?\d{2}-?\d{2})"
PAIR_RE = re.compile(rf"^{DATE}_{DATE}$")
CORNERS = ("x_min", "y_min", "x_max", "y_max")
PHASE_TOL = 1e-4  # float32 rounding of pi
MASK_ORIGINS = {
    "derived": "the deformation_mask rule on unwrapped phase",
    "annotation_box": "a human box rasterised (1 inside)",
    "annotation_polygons": "segmentation polygons rasterised (pixel centres inside)",
    "none": "no label (all ignore)",
}


def iso_date(s: str, where: str) -> str:
    """YYYYMMDD or YYYY-MM-DD -> YYYY-MM-DD; a day the calendar does not have (month 13, 30
    February) is refused."""
    import calendar

    d = str(s).replace("-", "")
    if not re.fullmatch(r"\d{8}", d):
        raise ConvertError(f"{where}: {s!r} is not a date (YYYYMMDD or YYYY-MM-DD)")
    y, m, day = int(d[:4]), int(d[4:6]), int(d[6:])
    if not 1 <= m <= 12:
        raise ConvertError(f"{where}: {s!r} is not a date (there is no month {m})")
    if not 1 <= day <= calendar.monthrange(y, m)[1]:
        raise ConvertError(
            f"{where}: {s!r} is not a date ({calendar.month_name[m]} {y} has no day {day})"
        )
    return f"{d[:4]}-{d[4:6]}-{d[6:]}"


@dataclass(frozen=True)
class Pair:
    """One interferometric pair as found by a scan."""

    id: str  # sample id: "<pair>" or "<frame>/<pair>"
    frame: str
    primary: str  # ISO dates
    secondary: str
    files: tuple[tuple[str, str], ...]  # (band group, url) in reading order
    height: int
    width: int
    crs: str | None = None
    transform: tuple[float, ...] | None = None
    annotation: str | None = None  # url of the annotation JSON (None: not annotated)

    def file(self, name: str) -> str | None:
        """The URL of one band group (`insar`, `coherence`, a band name), or None where this pair
        lacks it (optional bands)."""
        return dict(self.files).get(name)


@dataclass(frozen=True)
class TargetSpec:
    name: str
    type: str  # cls | regr
    source: str | None  # the reader quantity that feeds it; None: the layout cannot serve it
    classes: tuple[str, ...] = ()


class PairReader(SampleReader):
    """Shared part of interferogram layouts: catalog options, the plan, the cube."""

    rendered: bool = False  # True: image bands are renderings (no physical values)
    # skip: a bad pair is left out of the cube, counted and named (set by `plan`)
    on_error: str = "raise"
    # keep flagged samples (`--keep-corrupted`; set by `plan`), recorded as kept
    keep_flagged: bool = False

    # -- catalog options ---------------------------------------------------------------------
    @property
    def rules(self) -> Rules:
        """The layout's `derive:` parameters, validated; the synthetic generator derives its truth
        by the same rules."""
        return Rules.from_options(self.option("derive", {}, dict), self.where)

    @property
    def wavelength_m(self) -> float:
        """Radar wavelength in metres (required): turns phase into LOS displacement; an annotation
        may override it per pair."""
        return float(self.option("radar_wavelength_m", kind=(int, float)))

    @property
    def text_tasks(self) -> list[str]:
        """The free-text tasks, in the order of the cube's `answer` columns; answers naming other
        tasks are refused."""
        return [str(t) for t in self.option("text_tasks", [], list)]

    @property
    def box_task(self) -> str:
        """The task the deformation box serves, named in `unavailable` when no pair has a box."""
        return str(self.option("box_task", "deformation_localization", str))

    @property
    def targets(self) -> list[TargetSpec]:
        """The catalog's `targets:` in cube task order; `from: null` keeps a task the layout cannot
        serve (NaN targets, a reason in `unavailable`)."""
        out = []
        for name, d in self.option("targets", {}, dict).items():
            d = dict(d or {})
            kind = str(d.get("type", "cls"))
            if kind not in ("cls", "regr"):
                raise ConvertError(
                    f"{self.where}: targets.{name}.type must be cls or regr, not {kind!r}"
                )
            src = d.get("from")
            classes = tuple(str(c) for c in d.get("classes", ()))
            if src == "coherence_class" and not classes:
                classes = self.rules.coherence_classes
            out.append(TargetSpec(str(name), kind, None if src is None else str(src), classes))
        return out

    @property
    def mask_options(self) -> dict:
        """The `mask:` option: the per-pixel deformation target's class names and the split a dense
        family draws (sample cubes have none), recorded in the cube's attrs."""
        d = dict(self.option("mask", {}, dict))
        classes = [str(c) for c in d.get("classes", ("stable", "deformation"))]
        split = {
            str(k): float(v)
            for k, v in dict(d.get("split") or {"train": 0.6, "val": 0.2, "test": 0.2}).items()
        }
        if (
            len(classes) != 2
            or set(split) != {"train", "val", "test"}
            or not math.isclose(sum(split.values()), 1.0)
            or min(split.values()) <= 0
        ):
            raise ConvertError(
                f"{self.where}: mask: needs two classes (no deformation, deformation) and a split"
                f" with positive train, val and test fractions summing to 1, got {d!r}"
            )
        return {
            "classes": classes,
            "split": split,
            "rule": RULES_TEXT["deformation_mask"],
            "ignore_index": MASK_IGNORE,
            "origins": MASK_ORIGINS,
        }

    @property
    def unavailable(self) -> dict[str, str]:
        """The catalog's reasons a task has no label in this layout, written to the cube's attrs
        instead of the generic ones."""
        return {str(k): str(v) for k, v in self.option("unavailable", {}, dict).items()}

    def frame_name(self, k: int) -> str:
        """The frame folder of generated pair `k` when sample data spreads over several frames."""
        return f"frame{k:02d}"

    # -- contract for subclasses ------------------------------------------------------------------
    @abstractmethod
    def scan(self, root: str) -> list[Pair]:
        """Every pair folder under `root`, headers checked (a bad one is skipped with --on-error
        skip)."""

    @abstractmethod
    def pair_labels(self, pair: Pair, bands: list[str]) -> dict[str, Any]:
        """{"quantities": {name: float}, "box": (4,) | None, "box_origin": str, "mask": (H, W) int8
        | None, "mask_origin": str, "answers": {task: text}, "wavelength_m": float} of one pair
        (reads and checks its pixels where labels are derived; mask None = no label, all ignore)."""

    def cube_bands(self, pairs: list[Pair]) -> list[str]:
        """Names of the catalog bands this tree has (all of them unless a layout has optional
        bands)."""
        return self.spec.band_names

    @abstractmethod
    def read_sample(self, pair: Pair, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """Contract: one pair's bands, padded bottom/right with 0 to `shape` (the largest pair's),
        since pairs differ in size."""

    # -- shared ---------------------------------------------------------------------------------
    def guard(self, pair: str, fn, *args):
        """fn(*args); with --on-error skip, a ConvertError leaves pair `pair` out (noted with its
        reason) and gives None."""
        try:
            return fn(*args)
        except ConvertError as e:
            if self.on_error != "skip":
                raise
            # list.append is atomic across header threads
            self.skipped.append({"source": pair, "reason": str(e)})
            return None

    def load_annotation(self, url: str) -> dict:
        """An annotation file as a dict; bad JSON or a non-object is a ConvertError naming the file,
        so --on-error skip can drop the pair."""
        try:
            d = json.loads(self.open_bytes(url))
        except (ValueError, UnicodeDecodeError) as e:
            raise ConvertError(f"{url}: not valid JSON ({e})") from None
        if not isinstance(d, dict):
            raise ConvertError(f"{url}: an annotation is a JSON object, got {type(d).__name__}")
        return d

    def check_box(
        self, box: Any, pair: Pair, url: str, field: str = "box"
    ) -> tuple[float, ...] | None:
        """A box as (x_min, y_min, x_max, y_max) floats inside the pair with min < max, else a
        ConvertError naming the field; None (no deformation) stays None."""
        if box is None:
            return None
        try:
            b = tuple(float(v) for v in box)
        except (TypeError, ValueError):
            b = ()
        if len(b) != 4 or not all(math.isfinite(v) for v in b) or b[0] >= b[2] or b[1] >= b[3]:
            raise ConvertError(
                f"{url}: field {field!r} must be [x_min, y_min, x_max, y_max] with min < max, got"
                f" {box!r}"
            )
        if b[0] < 0 or b[1] < 0 or b[2] > pair.width or b[3] > pair.height:
            raise ConvertError(
                f"{url}: field {field!r} {list(b)} lies outside the {pair.width}x{pair.height} px"
                f" of pair {pair.id}"
            )
        return b

    def check_answers(self, answers: Any, url: str) -> dict[str, str]:
        """The annotation's `answers` as {text task: answer}; a task not in `text_tasks` is refused
        rather than silently dropped."""
        if answers is None:
            return {}
        if not isinstance(answers, dict):
            raise ConvertError(
                f"{url}: field 'answers' must map a text task to its reference answer"
            )
        unknown = sorted(set(answers) - set(self.text_tasks))
        if unknown:
            raise ConvertError(
                f"{url}: field 'answers' names {unknown}, not text tasks of {self.spec.id}"
                f" ({', '.join(self.text_tasks)})"
            )
        return {str(k): str(v) for k, v in answers.items()}

    def plan(
        self, raw: str, on_error: str = "raise", keep_corrupted: bool = False, **_
    ) -> tuple[list[Pair], SamplePlan]:
        """Scan, check every pair and compute every label on the client (threads): the one place bad
        input is found. on_error="skip": a bad pair is left out instead of refusing the tree
        (`skipped_samples` in the cube's attrs). Samples the annotations flag as damaged are left
        out (`skipped_samples`) unless `keep_corrupted` (`kept_flagged_samples`)."""
        self.on_error, self.skipped, self.kept, self.keep_flagged = (
            on_error,
            [],
            [],
            bool(keep_corrupted),
        )
        pairs = self.scan(raw)
        if pairs:
            bands = self.cube_bands(pairs)
            labels = map_threads(lambda p: self.guard(p.id, self.pair_labels, p, bands), pairs, 4)
            pairs, labels = (
                [p for p, lab in zip(pairs, labels) if lab is not None],
                [lab for lab in labels if lab is not None],
            )
        skipped = sorted(self.skipped, key=lambda d: (d["source"], d["reason"]))
        if not pairs:
            why = (
                f"; all {len(skipped)} were bad, e.g. {skipped[0]['source']}:"
                f" {skipped[0]['reason']}"
                if skipped
                else ""
            )
            raise ConvertError(
                f"{raw}: no interferogram pairs found for {self.spec.id} layout"
                f" {self.layout.name!r}{why}"
            )
        H, W = max(p.height for p in pairs), max(p.width for p in pairs)
        tspecs = self.targets
        target = np.full((len(pairs), len(tspecs)), np.nan, dtype=np.float32)
        for i, lab in enumerate(labels):
            for j, t in enumerate(tspecs):
                v = lab["quantities"].get(t.source) if t.source else None
                if v is not None:
                    target[i, j] = v
        box = np.array(
            [lab["box"] if lab["box"] is not None else (np.nan,) * 4 for lab in labels],
            dtype=np.float32,
        )
        # padding and unlabelled pairs: ignore
        mask = np.full((len(pairs), H, W), MASK_IGNORE, dtype=np.int8)
        for i, lab in enumerate(labels):
            if lab.get("mask") is not None:
                m = lab["mask"]
                mask[i, : m.shape[0], : m.shape[1]] = m
        answers = np.array(
            [[lab["answers"].get(t, "") for t in self.text_tasks] for lab in labels], dtype=object
        ).reshape(len(pairs), -1)
        unavailable = {
            t.name: self.unavailable.get(t.name, "no source in this layout")
            for t in tspecs
            if t.source is None
        }
        for j, t in enumerate(tspecs):
            if t.source is not None and not np.isfinite(target[:, j]).any():
                unavailable[t.name] = self.unavailable.get(t.name) or self.missing_reason(t, bands)
        if not np.isfinite(box).any():
            unavailable.setdefault(
                f"{self.box_task} (box)",
                self.missing_reason(TargetSpec("box", "box", "box"), bands),
            )
        for k, t in enumerate(self.text_tasks):
            if not any(answers[:, k]):
                unavailable.setdefault(
                    f"{t} (text)", self.unavailable.get(t, "no annotation gives this answer")
                )
        self.narrow(bands)
        tf = np.array(
            [p.transform if p.transform else (np.nan,) * 6 for p in pairs], dtype=np.float64
        )
        coords, data_vars = declared(
            {  # names and dims: cube.schema.SAMPLE_VARS
                "frame": _text([p.frame for p in pairs]),
                "primary_date": _text([p.primary for p in pairs]),
                "secondary_date": _text([p.secondary for p in pairs]),
                "radar_wavelength_m": np.array(
                    [lab["wavelength_m"] for lab in labels], dtype=np.float64
                ),
                "height": np.array([p.height for p in pairs], dtype=np.int32),
                "width": np.array([p.width for p in pairs], dtype=np.int32),
                "crs": _text([p.crs or "" for p in pairs]),
                "transform": tf,
                "box_origin": _text([lab["box_origin"] for lab in labels]),
                "mask_origin": _text(
                    [
                        lab.get("mask_origin", "none") if lab.get("mask") is not None else "none"
                        for lab in labels
                    ]
                ),
                "mask_pixels": (
                    np.stack([(mask == k).sum(axis=(1, 2)) for k in (0, 1)], axis=1).astype(
                        np.int32
                    )
                ),
                "mask_class": _text(self.mask_options["classes"]),
                "task_classes": _text(["|".join(t.classes) for t in tspecs]),
                "text_task": _text(self.text_tasks),
                "corner": _text(CORNERS),
                "box": box,
                "answer": answers,
                "mask": mask,
            }
        )
        attrs = {
            "derivation": (
                {**self.rules.as_attrs(), "radar_wavelength_m": self.wavelength_m}
                if not self.rendered
                else {}
            ),
            "unavailable": unavailable,
            "rendered": self.rendered,
            "box_task": self.box_task,
            "mask": self.mask_options,
            "padding": (
                "samples smaller than the cube are padded bottom/right with 0; height/width give"
                " the valid extent"
            ),
            "skipped_samples": skipped,
            **self.extra_attrs(raw, pairs),
        }
        kept = sorted(self.kept, key=lambda d: d["source"])
        if self.flags_samples:
            attrs["flagged_samples"] = (
                "kept (--keep-corrupted)" if self.keep_flagged else "left out (skipped_samples)"
            )
            attrs["kept_flagged_samples"] = kept
        fingerprint = {
            "options": self.options,
            "bands": bands,
            "skipped": skipped,
            "files": [(p.id, p.files, p.annotation, p.height, p.width) for p in pairs],
        }
        if kept:
            fingerprint["kept_flagged"] = kept
        return pairs, SamplePlan(
            ids=[p.id for p in pairs],
            shape=(len(bands), H, W),
            tasks=[(t.name, t.type) for t in tspecs],
            target=target,
            attrs=attrs,
            fingerprint=fingerprint,
            coords=coords,
            data_vars=data_vars,
        )

    def narrow(self, bands: list[str]) -> None:
        """Optional bands absent from this tree: the cube (and `check_image`) has only the
        others."""
        if bands != self.spec.band_names:
            self.spec = dataclasses.replace(
                self.spec, bands=tuple(b for b in self.spec.bands if b.name in bands)
            )

    def missing_reason(self, t: TargetSpec, bands: list[str]) -> str:
        """Why a task with a source still has no label in any pair; layouts override it to name the
        file they lack."""
        return "no pair has the data this label is derived from"

    def extra_attrs(self, raw: str, pairs: list[Pair]) -> dict:
        """Layout-specific cube attrs: none here; Hephaestus counts its unannotated pairs."""
        return {}

    def read_kwargs(self, plan: SamplePlan, **_) -> dict:
        """Narrows the bands to the plan's, since a prechecked plan was made by another reader
        object; workers pad to the plan's shape."""
        # a prechecked plan came from another reader object: its bands, not all
        self.narrow(plan.fingerprint["bands"])
        return {"shape": plan.shape}


def pad_to(img: np.ndarray, shape: tuple[int, ...] | None) -> np.ndarray:
    """Pairs differ in size but a sample cube's images share one shape: pads bottom/right with 0
    (height/width keep the valid extent)."""
    if shape is None or img.shape == tuple(shape):
        return img
    out = np.zeros(shape, dtype=img.dtype)
    out[:, : img.shape[1], : img.shape[2]] = img
    return out


@register
class InSARReader(PairReader):
    name = "insar_geotiff"
    options_doc = (
        "files (band -> file name in a pair folder), optional (bands that may be absent),"
        " annotation (file name), radar_wavelength_m, derive, targets, text_tasks, box_task, mask,"
        " unavailable"
    )

    @property
    def files(self) -> dict[str, str]:
        """Band -> file name in a pair folder (a required option); `detect` looks for the first."""
        return {str(k): str(v) for k, v in self.option("files", kind=dict).items()}

    @property
    def optional(self) -> list[str]:
        """Bands a tree may lack (unwrapped phase), but then in every pair: scan refuses a mix."""
        return [str(b) for b in self.option("optional", [], list)]

    @property
    def annotation_name(self) -> str:
        """The per-pair annotation file's name (default `annotation.json`); a pair without one is
        still a sample."""
        return str(self.option("annotation", "annotation.json", str))

    def detect(self, root: str) -> bool:
        """The first listed file one or two levels down (pair folders with or without a frame)."""
        fs, base = self.fs(root)
        first = next(iter(self.files.values()))
        return bool(
            fs.glob(posixpath.join(base.rstrip("/"), "*", first))
            or fs.glob(posixpath.join(base.rstrip("/"), "*", "*", first))
        )

    def scan(self, root: str) -> list[Pair]:
        """Pair folders one or two levels deep (`[<frame>/]<primary>_<secondary>`); dates, required
        files, and one band, size and CRS per file are checked."""
        fs, base = self.fs(root)
        base = base.rstrip("/")
        proto = root.split("://")[0] + "://" if _store.is_remote(root) else ""
        names = {**{v: k for k, v in self.files.items()}, self.annotation_name: "annotation"}
        folders: dict[str, dict[str, str]] = {}
        for depth in ("*", "*/*"):
            for fname, what in names.items():
                for p in fs.glob(posixpath.join(base, depth, fname)):
                    rel = posixpath.relpath(posixpath.dirname(p), base)
                    folders.setdefault(rel, {})[what] = p if p.startswith(proto) else proto + p
        required = [b for b in self.files if b not in self.optional]
        have_optional = {b: [r for r, f in folders.items() if b in f] for b in self.optional}

        def folder(rel):
            found = folders[rel]
            where = _store.join(root, rel)
            name = posixpath.basename(rel)
            m = PAIR_RE.match(name)
            if not m:
                raise ConvertError(
                    f"{where}: a pair folder is named <primary>_<secondary> (dates YYYYMMDD), not"
                    f" {name!r}"
                )
            for k in (1, 2):  # an impossible date is refused here, before any raster is read
                iso_date(m.group(k), f"{where}: pair {rel}")
            for b in required:
                if b not in found:
                    raise ConvertError(
                        f"{where}: pair {rel} has no {self.files[b]} (every pair needs "
                        f"{', '.join(self.files[r] for r in required)})"
                    )
            for b, with_it in have_optional.items():
                if with_it and b not in found:
                    raise ConvertError(
                        f"{where}: pair {rel} has no {self.files[b]} while {len(with_it)} other"
                        f" pair(s) have one (e.g. {with_it[0]}); give it to every pair or to none"
                    )
            return rel, name, m, found, where

        pairs = [
            j for j in (self.guard(rel, folder, rel) for rel in sorted(folders)) if j is not None
        ]
        if not pairs:
            return []

        def header(job):
            rel, name, m, found, where = job
            heads = {b: raster_header(self, found[b]) for b in self.files if b in found}
            ref_b = required[0]
            ref = heads[ref_b]
            for b, h in heads.items():
                if h.bands != 1:
                    raise ConvertError(
                        f"{found[b]}: {h.bands} bands; an interferogram file holds one"
                    )
                if (h.height, h.width) != (ref.height, ref.width):
                    raise ConvertError(
                        f"{found[b]}: {h.height}x{h.width} px, but {self.files[ref_b]} of pair"
                        f" {rel} is {ref.height}x{ref.width}"
                    )
                if (h.crs or "") != (ref.crs or ""):
                    raise ConvertError(
                        f"{found[b]}: CRS {h.crs or 'none'} differs from {self.files[ref_b]}'s"
                        f" {ref.crs or 'none'} in pair {rel}"
                    )
            files = tuple((b, found[b]) for b in self.files if b in found)
            frame = posixpath.dirname(rel)
            return Pair(
                rel,
                frame,
                iso_date(m.group(1), where),
                iso_date(m.group(2), where),
                files,
                ref.height,
                ref.width,
                ref.crs,
                ref.transform,
                found.get("annotation"),
            )

        return [
            p for p in map_threads(lambda j: self.guard(j[0], header, j), pairs, 4) if p is not None
        ]

    def cube_bands(self, pairs: list[Pair]) -> list[str]:
        """Optional bands are in all pairs or none (scan checks), so the first pair decides."""
        return [b for b in self.spec.band_names if pairs[0].file(b)]

    def missing_reason(self, t: TargetSpec, bands: list[str]) -> str:
        """Without unwrapped phase, says fringes and the box need it (not the generic reason)."""
        if "unwrapped_phase" not in bands and t.source in ("fringes", "box"):
            return (
                f"no {self.files.get('unwrapped_phase', 'unwrapped_phase.tif')} in the raw tree:"
                " fringes and the deformation box are derived from unwrapped phase (boxes then"
                " come only from annotations)"
            )
        return super().missing_reason(t, bands)

    def _read(self, url: str) -> np.ndarray:
        return read_raster(self, url)[0].astype(np.float32, copy=False)

    def check_values(self, pair: Pair, maps: dict[str, np.ndarray]) -> None:
        """Wrapped phase in [-pi, pi] radians, coherence in [0, 1], both finite: else one sentence
        naming the file."""
        for b, a in maps.items():
            url = pair.file(b)
            bad = ~np.isfinite(a)
            if bad.any() and b != "unwrapped_phase":
                raise ConvertError(
                    f"{url}: {int(bad.sum())} NaN/inf pixels in the {b} of pair {pair.id}"
                )
        w = maps["wrapped_phase"]
        hi = float(np.abs(w).max())
        if hi > math.pi + PHASE_TOL:
            unit = (
                " (it looks like degrees: convert to radians)"
                if hi <= 180 + 1e-3 and hi > 2 * math.pi
                else ""
            )
            raise ConvertError(
                f"{pair.file('wrapped_phase')}: wrapped phase of pair {pair.id} reaches {hi:.4g},"
                f" outside [-pi, pi] radians{unit}"
            )
        c = maps["coherence"]
        lo, up = float(c.min()), float(c.max())
        if lo < -1e-6 or up > 1 + 1e-6:
            raise ConvertError(
                f"{pair.file('coherence')}: coherence of pair {pair.id} spans {lo:.4g}..{up:.4g},"
                " outside [0, 1]"
            )

    def pair_labels(self, pair: Pair, bands: list[str]) -> dict[str, Any]:
        """Reads and checks the maps (radians, coherence 0..1) and derives labels; an annotation's
        box wins over the derived one, its wavelength over the catalog's."""
        maps = {b: self._read(pair.file(b)) for b in bands}
        self.check_values(pair, maps)
        ann = self.load_annotation(pair.annotation) if pair.annotation else {}
        url = pair.annotation or ""
        name = posixpath.basename(pair.id)
        if "pair" in ann and str(ann["pair"]) not in (name, pair.id):
            raise ConvertError(
                f"{url}: field 'pair' names pair {ann['pair']!r}, but the annotation lies in the"
                f" folder of pair {pair.id}; no pair {ann['pair']!r} is annotated by it"
            )
        wl = ann.get("radar_wavelength_m", self.wavelength_m)
        if not isinstance(wl, (int, float)) or not 0 < wl < 1:
            raise ConvertError(
                f"{url}: field 'radar_wavelength_m' must be a wavelength in metres, got {wl!r}"
            )
        if "box" in ann:  # a human box wins over the derived one; null = no deformation
            box = self.check_box(ann["box"], pair, url)
            d = derive(
                maps["coherence"], maps.get("unwrapped_phase"), float(wl), self.rules, box=box
            )
            origin = "annotation"
        else:
            d = derive(maps["coherence"], maps.get("unwrapped_phase"), float(wl), self.rules)
            origin = "derived" if "unwrapped_phase" in maps else "none"
        return {
            "quantities": {"coherence_class": d["coherence_class"], "fringes": d["fringes"]},
            "box": d["box"],
            "box_origin": origin,
            "mask": d["mask"],
            "mask_origin": {"annotation": "annotation_box"}.get(origin, origin),
            "answers": self.check_answers(ann.get("answers"), url),
            "wavelength_m": float(wl),
        }

    def read_sample(self, pair: Pair, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """The cube's bands (narrowed to those present) as float32, padded to the largest pair."""
        bands = [b.name for b in self.spec.bands]
        return pad_to(np.stack([self._read(pair.file(b)) for b in bands]), shape)

    # -- sample data ----------------------------------------------------------------------------
    def write_pair(
        self, root: str, pair, annotate: bool = True, boxes: bool = False, index: int = 0
    ) -> tuple[str, dict]:
        """Write one generated pair (insar_synthetic.IfgPair) where `scan` finds it; returns (sample
        id, paths)."""
        import os

        name = f"{pair.primary.replace('-', '')}_{pair.secondary.replace('-', '')}"
        rel = f"{pair.frame}/{name}" if pair.frame else name
        folder = os.path.join(root, rel)
        os.makedirs(folder, exist_ok=True)
        crs, tf = "EPSG:32633", (100.0, 0.0, 500000.0 + 10000.0 * index, 0.0, -100.0, 4000000.0)
        paths = {}
        for b, fname in self.files.items():
            a = {
                "wrapped_phase": pair.wrapped,
                "coherence": pair.coherence,
                "unwrapped_phase": pair.unwrapped,
            }[b]
            if a is None:
                continue
            paths[b] = os.path.join(folder, fname)
            write_geotiff(paths[b], a.astype(np.float32), crs, tf)
        if annotate:
            ann: dict[str, Any] = {"pair": name, "answers": dict(pair.answers)}
            if boxes:
                ann["box"] = list(pair.box) if pair.box is not None else None
            paths["annotation"] = os.path.join(folder, self.annotation_name)
            with open(paths["annotation"], "w") as f:
                json.dump(ann, f, indent=1)
        return rel, paths
