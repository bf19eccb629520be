"""Interferogram pairs -> one sample cube (docs/insar-cube.md): `PairReader` is what every
interferogram layout shares (pair folders, the plan checked on the client before a cluster starts),
`InSARReader` the GeoTIFF layout; `hephaestus.py` reads the Hephaestus PNG layout."""

from __future__ import annotations

import calendar
import dataclasses
import json
import math
import os
import posixpath
import re
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .. import store as _store
from ..cube import SamplePlan, _text, declared
from ..mapping import from_mapping, rule
from .base import ConvertError, Option, register, text_map, texts
from .insar_labels import MASK_IGNORE, RULES_TEXT, Rules, derive
from .rawio import map_threads, raster_header, read_raster, write_geotiff
from .samples import SampleReader

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
    """YYYYMMDD or YYYY-MM-DD -> YYYY-MM-DD; a day the calendar lacks is refused."""
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


def pair_dates(name: str, where: str) -> tuple[str, str] | None:
    """The ISO dates of a `<primary>_<secondary>` name (None if not so named)."""
    m = PAIR_RE.match(name)
    return None if m is None else (iso_date(m.group(1), where), iso_date(m.group(2), where))


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
        """The URL of one band group, or None where the pair lacks it (optional bands)."""
        return dict(self.files).get(name)


@dataclass(frozen=True)
class TargetSpec:
    """One of a layout's `targets:`, an image-level task of the cube."""

    NOUN: ClassVar[str] = "target field"
    ERROR: ClassVar = ConvertError  # bare: the field `type` shadows the builtin in the class

    name: str
    type: str = rule("cls", choices=("cls", "regr"))
    # the reader quantity that feeds it; None (`from: null`): the layout cannot serve it
    source: str | None = rule(None, key="from")
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
        """The layout's `derive:` parameters; the synthetic generator derives by the same."""
        return Rules.from_options(self.option("derive", {}, dict), self.where)

    # radar wavelength in metres (required; an annotation may override it per pair)
    wavelength_m = Option("radar_wavelength_m", kind=(int, float), convert=float)
    # the free-text tasks, in the order of the cube's `answer` columns
    text_tasks = Option("text_tasks", [], list, texts)
    # the task the deformation box serves, named in `unavailable` when no pair has a box
    box_task = Option("box_task", "deformation_localization", str)
    # the catalog's reasons a task has no label in this layout (cube attrs)
    unavailable = Option("unavailable", {}, dict, text_map)

    @property
    def targets(self) -> list[TargetSpec]:
        """The catalog's `targets:` in task order; coherence classes default to the rule's."""
        out = []
        for name, d in self.option("targets", {}, dict).items():
            where = f"{self.where}.targets.{name}"
            t = from_mapping(TargetSpec, {"name": str(name), **(d or {})}, where)
            if t.source == "coherence_class" and not t.classes:
                t = dataclasses.replace(t, classes=self.rules.coherence_classes)
            out.append(t)
        return out

    @property
    def mask_options(self) -> dict:
        """The `mask:` option: class names and the split a dense family draws (cube attrs)."""
        d = dict(self.option("mask", {}, dict))
        classes = [str(c) for c in d.get("classes", ("stable", "deformation"))]
        given = d.get("split") or {"train": 0.6, "val": 0.2, "test": 0.2}
        split = {str(k): float(v) for k, v in dict(given).items()}
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

    @staticmethod
    def folder_name(pair) -> str:
        """A generated pair's folder, `<primary>_<secondary>` (dates YYYYMMDD)."""
        return f"{pair.primary.replace('-', '')}_{pair.secondary.replace('-', '')}"

    def frame_name(self, k: int) -> str:
        """The frame folder of generated pair `k` when sample data spreads over several frames."""
        return f"frame{k:02d}"

    # -- contract for subclasses ------------------------------------------------------------------
    @abstractmethod
    def scan(self, root: str) -> list[Pair]:
        """Every pair under `root`, headers checked (a bad one skipped with --on-error skip)."""

    @abstractmethod
    def pair_labels(self, pair: Pair, bands: list[str]) -> dict[str, Any]:
        """Quantities, box, mask, answers and wavelength of one pair (mask None: all ignore)."""

    def cube_bands(self, pairs: list[Pair]) -> list[str]:
        """The catalog bands this tree has (optional bands may be absent)."""
        return self.spec.band_names

    # -- shared ---------------------------------------------------------------------------------
    def pair_folders(self, root: str, globs: list[tuple[str, str]]) -> dict[str, dict[str, str]]:
        """{pair folder under `root`: {band group: url}} of what each (group, glob) finds."""
        out: dict[str, dict[str, str]] = {}
        for what, pattern in globs:
            for rel, url in self.glob(root, pattern).items():
                out.setdefault(posixpath.dirname(rel), {})[what] = url
        return out

    def each(self, fn, jobs: list, name) -> list:
        """fn(job) for every job on 4 threads, a bad one skipped or refused (`guard`)."""
        got = map_threads(lambda j: self.guard(name(j), fn, j), jobs, 4)
        return [x for x in got if x is not None]

    def pair_from_headers(
        self, pid: str, dates: tuple, files: dict, ref: str, annotation=None, one_band=False
    ) -> Pair:
        """The pair of `files`, whose headers must agree with `files[ref]` in size and CRS."""
        heads = {b: raster_header(self, u) for b, u in files.items()}
        r, rname = heads[ref], posixpath.basename(files[ref])
        for b, h in heads.items():
            if one_band and h.bands != 1:
                raise ConvertError(f"{files[b]}: {h.bands} bands; an interferogram file holds one")
            if (h.height, h.width) != (r.height, r.width):
                raise ConvertError(
                    f"{files[b]}: {h.height}x{h.width} px, but {rname} of pair {pid} is"
                    f" {r.height}x{r.width}"
                )
            if (h.crs or "") != (r.crs or ""):
                raise ConvertError(
                    f"{files[b]}: CRS {h.crs or 'none'} differs from {rname}'s {r.crs or 'none'}"
                    f" in pair {pid}"
                )
        frame, items = posixpath.dirname(pid), tuple(files.items())
        return Pair(pid, frame, *dates, items, r.height, r.width, r.crs, r.transform, annotation)

    def guard(self, pair: str, fn, *args):
        """fn(*args); with --on-error skip, a ConvertError leaves the pair out (noted): None."""
        try:
            return fn(*args)
        except ConvertError as e:
            if self.on_error != "skip":
                raise
            # list.append is atomic across header threads
            self.skipped.append({"source": pair, "reason": str(e)})
            return None

    def load_annotation(self, url: str) -> dict:
        """An annotation file as a dict; anything else is a ConvertError naming the file."""
        try:
            d = json.loads(self.open_bytes(url))
        except (ValueError, UnicodeDecodeError) as e:
            raise ConvertError(f"{url}: not valid JSON ({e})") from None
        if not isinstance(d, dict):
            raise ConvertError(f"{url}: an annotation is a JSON object, got {type(d).__name__}")
        return d

    def check_box(self, box, pair: Pair, url: str, field: str = "box") -> tuple[float, ...] | None:
        """A box (x_min, y_min, x_max, y_max) inside the pair with min < max; None stays None."""
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
        """The annotation's `answers`; a task not in `text_tasks` is refused, never dropped."""
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
        """Every pair checked and labelled on the client, the one place bad input is found."""
        self.on_error, self.keep_flagged = on_error, bool(keep_corrupted)
        self.skipped, self.kept = [], []
        pairs, labels, bands = self._labelled(raw)
        skipped = sorted(self.skipped, key=lambda d: (d["source"], d["reason"]))
        tspecs = self.targets
        target, box, mask, answers = self._label_arrays(pairs, labels, tspecs)
        unavailable = self._unavailable(tspecs, bands, target, box, answers)
        self.narrow(bands)
        pixels = np.stack([(mask == k).sum(axis=(1, 2)) for k in (0, 1)], axis=1).astype(np.int32)
        coords, data_vars = declared(
            {  # names and dims: cube.schema.SAMPLE_VARS
                **self._pair_vars(pairs, labels),
                "mask_pixels": pixels,
                "mask_class": _text(self.mask_options["classes"]),
                "task_classes": _text(["|".join(t.classes) for t in tspecs]),
                "text_task": _text(self.text_tasks),
                "corner": _text(CORNERS),
                "box": box,
                "answer": answers,
                "mask": mask,
            }
        )
        kept = sorted(self.kept, key=lambda d: d["source"])
        fingerprint = {
            "options": self.options,
            "bands": bands,
            "skipped": skipped,
            "files": [(p.id, p.files, p.annotation, p.height, p.width) for p in pairs],
            **({"kept_flagged": kept} if kept else {}),
        }
        return pairs, SamplePlan(
            ids=[p.id for p in pairs],
            shape=(len(bands), max(p.height for p in pairs), max(p.width for p in pairs)),
            tasks=[(t.name, t.type) for t in tspecs],
            target=target,
            attrs=self._attrs(raw, pairs, unavailable, skipped, kept),
            fingerprint=fingerprint,
            coords=coords,
            data_vars=data_vars,
        )

    def _labelled(self, raw: str) -> tuple[list[Pair], list[dict], list[str]]:
        """(pairs, labels, bands); none left is an error naming the first bad pair."""
        pairs, labels, bands = self.scan(raw), [], []
        if pairs:
            bands = self.cube_bands(pairs)
            good = self.each(lambda p: (p, self.pair_labels(p, bands)), pairs, lambda p: p.id)
            pairs, labels = [p for p, _ in good], [lab for _, lab in good]
        if not pairs:
            bad = sorted(self.skipped, key=lambda d: (d["source"], d["reason"]))
            why = [f"; all {len(bad)} were bad, e.g. {d['source']}: {d['reason']}" for d in bad[:1]]
            raise ConvertError(
                f"{raw}: no interferogram pairs found for {self.spec.id} layout"
                f" {self.layout.name!r}{''.join(why)}"
            )
        return pairs, labels, bands

    def _label_arrays(self, pairs: list[Pair], labels: list[dict], tspecs: list[TargetSpec]):
        """(target, box, mask, answer); no label is NaN, padding and unlabelled pixels ignore."""
        rows = [[lab["quantities"].get(t.source) for t in tspecs] for lab in labels]
        target = np.array(rows, dtype=np.float32).reshape(len(pairs), len(tspecs))
        box = np.array([lab["box"] or (np.nan,) * 4 for lab in labels], dtype=np.float32)
        H, W = max(p.height for p in pairs), max(p.width for p in pairs)
        mask = np.full((len(pairs), H, W), MASK_IGNORE, dtype=np.int8)
        for i, m in enumerate(lab["mask"] for lab in labels):
            if m is not None:
                mask[i, : m.shape[0], : m.shape[1]] = m
        said = [[lab["answers"].get(t, "") for t in self.text_tasks] for lab in labels]
        answers = np.array(said, dtype=object).reshape(len(pairs), -1)
        return target, box, mask, answers

    def _unavailable(self, tspecs, bands, target, box, answers) -> dict[str, str]:
        """Why each task without any label has none: the catalog's reason, else the layout's."""
        out = {
            t.name: self.unavailable.get(t.name, "no source in this layout")
            for t in tspecs
            if t.source is None
        }
        for j, t in enumerate(tspecs):
            if t.source is not None and not np.isfinite(target[:, j]).any():
                out[t.name] = self.unavailable.get(t.name) or self.missing_reason(t, bands)
        if not np.isfinite(box).any():
            why = self.missing_reason(TargetSpec("box", "box", "box"), bands)
            out.setdefault(f"{self.box_task} (box)", why)
        for k, t in enumerate(self.text_tasks):
            if not any(answers[:, k]):
                why = self.unavailable.get(t, "no annotation gives this answer")
                out.setdefault(f"{t} (text)", why)
        return out

    @staticmethod
    def _pair_vars(pairs: list[Pair], labels: list[dict]) -> dict[str, np.ndarray]:
        """The per-pair coordinates: where and when each pair is, and where its labels came from."""
        return {
            "frame": _text([p.frame for p in pairs]),
            "primary_date": _text([p.primary for p in pairs]),
            "secondary_date": _text([p.secondary for p in pairs]),
            "radar_wavelength_m": np.array([lab["wavelength_m"] for lab in labels], np.float64),
            "height": np.array([p.height for p in pairs], dtype=np.int32),
            "width": np.array([p.width for p in pairs], dtype=np.int32),
            "crs": _text([p.crs or "" for p in pairs]),
            "transform": np.array([p.transform or (np.nan,) * 6 for p in pairs], np.float64),
            "box_origin": _text([lab["box_origin"] for lab in labels]),
            "mask_origin": _text([lab["mask_origin"] for lab in labels]),
        }

    def _attrs(self, raw, pairs, unavailable, skipped, kept) -> dict:
        attrs = {
            # renderings carry no physical values, so nothing is derived from them
            "derivation": {}
            if self.rendered
            else {**self.rules.as_attrs(), "radar_wavelength_m": self.wavelength_m},
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
        if self.flags_samples:
            attrs["flagged_samples"] = (
                "kept (--keep-corrupted)" if self.keep_flagged else "left out (skipped_samples)"
            )
            attrs["kept_flagged_samples"] = kept
        return attrs

    def narrow(self, bands: list[str]) -> None:
        """Optional bands absent from this tree leave the cube (and `check_image`)."""
        if bands != self.spec.band_names:
            kept = tuple(b for b in self.spec.bands if b.name in bands)
            self.spec = dataclasses.replace(self.spec, bands=kept)

    def missing_reason(self, t: TargetSpec, bands: list[str]) -> str:
        """Why a task with a source has no label in any pair; layouts name the file they lack."""
        return "no pair has the data this label is derived from"

    def extra_attrs(self, raw: str, pairs: list[Pair]) -> dict:
        """Layout-specific cube attrs: none here; Hephaestus counts its unannotated pairs."""
        return {}

    def read_kwargs(self, plan: SamplePlan) -> dict:
        """The cube's image shape, which every sample is padded to."""
        return {"shape": plan.shape}


def write_json(path: str, obj: Any) -> str:
    """Sample data: a JSON file (its folder made); returns its path."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
    return path


def pad_to(img: np.ndarray, shape: tuple[int, ...] | None) -> np.ndarray:
    """Pads bottom/right with 0 to the cube's one image shape (height/width keep the extent)."""
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

    # band -> file name in a pair folder (required); `detect` looks for the first
    files = Option("files", kind=dict, convert=text_map)
    # the per-pair annotation file's name; a pair without one is still a sample
    annotation_name = Option("annotation", "annotation.json", str)
    # bands a tree may lack (unwrapped phase), but then in every pair: scan refuses a mix
    optional = Option("optional", [], list, texts)

    def detect(self, root: str) -> bool:
        """The first listed file one or two levels down (pair folders with or without a frame)."""
        first = next(iter(self.files.values()))
        return bool(self.glob(root, f"*/{first}") or self.glob(root, f"*/*/{first}"))

    @property
    def required(self) -> list[str]:
        """The bands every pair has; the first is the one the others' headers must match."""
        return [b for b in self.files if b not in self.optional]

    def scan(self, root: str) -> list[Pair]:
        """Pair folders `[<frame>/]<primary>_<secondary>`: dates, files, band, size, CRS checked."""
        names = [*self.files.items(), ("annotation", self.annotation_name)]
        folders = self.pair_folders(
            root, [(what, f"{depth}/{f}") for depth in ("*", "*/*") for what, f in names]
        )
        have = {b: [r for r, f in folders.items() if b in f] for b in self.optional}
        jobs = [  # (pair, dates, band files, annotation)
            (rel, dates, {b: f[b] for b in self.files if b in f}, f.get("annotation"))
            for rel, f in sorted(folders.items())
            if (dates := self.guard(rel, self._check_folder, root, rel, f, have))
        ]
        ref = self.required[0]
        return self.each(
            lambda j: self.pair_from_headers(j[0], j[1], j[2], ref, annotation=j[3], one_band=True),
            jobs,
            lambda j: j[0],
        )

    def _check_folder(self, root: str, rel: str, found: dict, have: dict) -> tuple[str, str]:
        """The pair's dates once its name and files are checked, before any raster is read."""
        where = _store.join(root, rel)
        name = posixpath.basename(rel)
        dates = pair_dates(name, f"{where}: pair {rel}")
        if dates is None:
            raise ConvertError(
                f"{where}: a pair folder is named <primary>_<secondary> (dates YYYYMMDD), not"
                f" {name!r}"
            )
        for b in self.required:
            if b not in found:
                raise ConvertError(
                    f"{where}: pair {rel} has no {self.files[b]} (every pair needs "
                    f"{', '.join(self.files[r] for r in self.required)})"
                )
        for b, with_it in have.items():
            if with_it and b not in found:
                raise ConvertError(
                    f"{where}: pair {rel} has no {self.files[b]} while {len(with_it)} other"
                    f" pair(s) have one (e.g. {with_it[0]}); give it to every pair or to none"
                )
        return dates

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
        """Wrapped phase in [-pi, pi] rad, coherence in [0, 1], both finite."""
        for b, a in maps.items():
            bad = ~np.isfinite(a)
            if bad.any() and b != "unwrapped_phase":
                raise ConvertError(
                    f"{pair.file(b)}: {int(bad.sum())} NaN/inf pixels in the {b} of pair {pair.id}"
                )
        hi = float(np.abs(maps["wrapped_phase"]).max())
        if hi > math.pi + PHASE_TOL:
            degrees = 2 * math.pi < hi <= 180 + 1e-3
            unit = " (it looks like degrees: convert to radians)" if degrees else ""
            raise ConvertError(
                f"{pair.file('wrapped_phase')}: wrapped phase of pair {pair.id} reaches {hi:.4g},"
                f" outside [-pi, pi] radians{unit}"
            )
        lo, up = float(maps["coherence"].min()), float(maps["coherence"].max())
        if lo < -1e-6 or up > 1 + 1e-6:
            raise ConvertError(
                f"{pair.file('coherence')}: coherence of pair {pair.id} spans {lo:.4g}..{up:.4g},"
                " outside [0, 1]"
            )

    def pair_labels(self, pair: Pair, bands: list[str]) -> dict[str, Any]:
        """Labels derived from the maps; an annotation's box and wavelength win."""
        maps = {b: self._read(pair.file(b)) for b in bands}
        self.check_values(pair, maps)
        ann = self.load_annotation(pair.annotation) if pair.annotation else {}
        url = pair.annotation or ""
        if "pair" in ann and str(ann["pair"]) not in (posixpath.basename(pair.id), pair.id):
            raise ConvertError(
                f"{url}: field 'pair' names pair {ann['pair']!r}, but the annotation lies in the"
                f" folder of pair {pair.id}; no pair {ann['pair']!r} is annotated by it"
            )
        wl = ann.get("radar_wavelength_m", self.wavelength_m)
        if not isinstance(wl, (int, float)) or not 0 < wl < 1:
            raise ConvertError(
                f"{url}: field 'radar_wavelength_m' must be a wavelength in metres, got {wl!r}"
            )
        # a human box wins over the derived one (`...`: derive it); null = no deformation
        box = self.check_box(ann["box"], pair, url) if "box" in ann else ...
        d = derive(maps["coherence"], maps.get("unwrapped_phase"), float(wl), self.rules, box=box)
        origin = (
            "annotation" if "box" in ann else "derived" if "unwrapped_phase" in maps else "none"
        )
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
    def write_pair(self, root, pair, annotate=True, boxes=False, index=0) -> tuple[str, dict]:
        """Sample data: one `insar_synthetic.IfgPair`; returns (sample id, paths)."""
        name = self.folder_name(pair)
        rel = f"{pair.frame}/{name}" if pair.frame else name
        folder = os.path.join(root, rel)
        os.makedirs(folder, exist_ok=True)
        crs, tf = "EPSG:32633", (100.0, 0.0, 500000.0 + 10000.0 * index, 0.0, -100.0, 4000000.0)
        paths = {}
        for b, fname in self.files.items():
            a = getattr(pair, b.removesuffix("_phase"))  # IfgPair's wrapped, unwrapped, coherence
            if a is None:
                continue
            paths[b] = os.path.join(folder, fname)
            write_geotiff(paths[b], a.astype(np.float32), crs, tf)
        if annotate:
            ann: dict[str, Any] = {"pair": name, "answers": dict(pair.answers)}
            if boxes:
                ann["box"] = list(pair.box) if pair.box is not None else None
            paths["annotation"] = write_json(os.path.join(folder, self.annotation_name), ann)
        return rel, paths
