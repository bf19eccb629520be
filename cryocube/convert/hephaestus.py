"""Hephaestus (CVPR 2022 EarthVision): LiCSAR interferogram renderings over volcanoes with human
annotations.

Raw layout: `<FrameID>/interferograms/<primary>_<secondary>/{InSAR.png, Coherence.png}` and
`annotations/<uniqueID>.json` (frameID, primary_date, secondary_date, label, activity_type,
intensity_level, phase, atmospheric_fringes 0-3, low_coherence, segmentation_mask polygons, caption
...). Only annotated interferograms become samples. The PNGs are renderings, not radians: the cube
keeps them as rendered bands (InSAR.png's RGB, Coherence.png's grey level, 0..255) and derives
nothing from their pixels; the annotation fields map onto tasks through the catalog's `targets`
(docs/insar-cube.md).
"""

from __future__ import annotations

import math
import os
import posixpath
from typing import Any

import numpy as np

from .. import store as _store
from .base import ConvertError, register
from .insar import PAIR_RE, Pair, PairReader, iso_date, pad_to
from .insar_labels import polygon_mask
from .rawio import map_threads, raster_header, read_raster, write_png


def render_phase(phase: np.ndarray) -> np.ndarray:
    """(3, H, W) uint8: wrapped phase through a cyclic hue wheel (full saturation and value)."""
    h = (np.asarray(phase, np.float64) + math.pi) / (2 * math.pi) * 6.0
    i = np.floor(h).astype(int) % 6
    f = h - np.floor(h)
    q, t = 1 - f, f
    one, zero = np.ones_like(f), np.zeros_like(f)
    r = np.choose(i, [one, q, zero, zero, t, one])
    g = np.choose(i, [t, one, one, q, zero, zero])
    b = np.choose(i, [zero, zero, t, one, one, q])
    return np.clip(np.rint(np.stack([r, g, b]) * 255), 0, 255).astype(np.uint8)


def polygons(polys: Any, url: str) -> list[list[tuple[float, float]]]:
    """The `segmentation_mask` polygons as point lists: each a flat [x1, y1, x2, y2, ...] or a list
    of [x, y]."""
    out = []
    for k, poly in enumerate(polys if isinstance(polys, list) else [polys] if polys else []):
        try:
            flat = [
                float(v) for pt in poly for v in (pt if isinstance(pt, (list, tuple)) else [pt])
            ]
        except (TypeError, ValueError):
            flat = []
        if len(flat) < 6 or len(flat) % 2:
            raise ConvertError(
                f"{url}: field 'segmentation_mask' polygon {k} is not a list of >= 3 (x, y) points"
            )
        out.append(list(zip(flat[0::2], flat[1::2])))
    return out


def polygon_box(polys: Any, url: str) -> tuple[float, float, float, float] | None:
    """Extent (x_min, y_min, x_max, y_max) of all polygons."""
    pts = [p for poly in polygons(polys, url) for p in poly]
    if not pts:
        return None
    xs, ys = [x for x, _ in pts], [y for _, y in pts]
    return min(xs), min(ys), max(xs), max(ys)


@register
class HephaestusReader(PairReader):
    name = "hephaestus_png"
    options_doc = (
        "interferograms (folder under a frame), insar_png, coherence_png, annotations (folder),"
        " radar_wavelength_m, targets, text_tasks, box_task, mask, unavailable, description"
        " (template of the localisation answer)"
    )
    rendered = True
    flags_samples = True  # annotations carry `corrupted` and `processing_error`
    FLAGS = ("corrupted", "processing_error")

    @property
    def names(self) -> tuple[str, str, str, str]:
        """(interferograms folder, InSAR PNG, coherence PNG, annotations folder), defaulting to the
        release's spelling."""
        return (
            str(self.option("interferograms", "interferograms", str)),
            str(self.option("insar_png", "InSAR.png", str)),
            str(self.option("coherence_png", "Coherence.png", str)),
            str(self.option("annotations", "annotations", str)),
        )

    def frame_name(self, k: int) -> str:
        """A LiCSAR-style frame id (`100D_04800_131300` for k = 0) for generated frame `k`, so
        sample trees look like the release."""
        return f"{100 + k}D_0{4800 + k}_13{1300 + k}"

    def detect(self, root: str) -> bool:
        """An annotations folder plus at least one `<frame>/<interferograms>/<pair>/InSAR.png`."""
        fs, base = self.fs(root)
        ifg, png, _, ann = self.names
        return self.isdir(_store.join(root, ann)) and bool(
            fs.glob(posixpath.join(base.rstrip("/"), "*", ifg, "*", png))
        )

    def scan(self, root: str) -> list[Pair]:
        """Only annotated pairs with both PNGs become samples; flagged ones are dropped unless
        --keep-corrupted, and an annotation of a missing or twice-annotated pair is refused."""
        fs, base = self.fs(root)
        base = base.rstrip("/")
        ifg, png, coh, ann_dir = self.names
        proto = root.split("://")[0] + "://" if _store.is_remote(root) else ""
        found: dict[tuple[str, str], dict[str, str]] = {}
        for what, fname in (("insar", png), ("coherence", coh)):
            for p in fs.glob(posixpath.join(base, "*", ifg, "*", fname)):
                folder = posixpath.dirname(p)
                key = (
                    posixpath.basename(posixpath.dirname(posixpath.dirname(folder))),
                    posixpath.basename(folder),
                )
                found.setdefault(key, {})[what] = p if p.startswith(proto) else proto + p

        def complete(key):
            frame, name = key
            where = _store.join(root, frame, ifg, name)
            for what, fname in (("insar", png), ("coherence", coh)):
                if what not in found[key]:
                    raise ConvertError(
                        f"{where}: pair {frame}/{name} has no {fname} "
                        f"(every interferogram needs {png} and {coh})"
                    )
            m = PAIR_RE.match(name)
            # an impossible date is refused here, before any file is read
            for k in (1, 2) if m else ():
                iso_date(m.group(k), f"{where}: pair {frame}/{name}")
            return key

        whole = {
            k: found[k]
            for k in sorted(found)
            if self.guard(f"{k[0]}/{k[1]}", complete, k) is not None
        }
        # pairs skipped for a missing file (already noted)
        left_out, found = set(found) - set(whole), whole
        annotated: dict[tuple[str, str], str] = {}
        flagged: set[tuple[str, str]] = set()

        def annotation(url):
            d = self.load_annotation(url)
            for f in ("frameID", "primary_date", "secondary_date"):
                if f not in d:
                    raise ConvertError(f"{url}: missing field {f!r}")
            written = "_".join(
                str(d[k]).replace("-", "") for k in ("primary_date", "secondary_date")
            )
            if (str(d["frameID"]), written) in left_out:
                return  # its pair was already left out (and named)
            where = f"{url} (pair {d['frameID']}/{written})"
            name = "_".join(
                iso_date(d[k], where).replace("-", "") for k in ("primary_date", "secondary_date")
            )
            key = (str(d["frameID"]), name)
            if key in left_out:
                return
            flags = [f for f in self.FLAGS if self.flag(d, f, 1, url)]
            if flags and key in found:
                flagged.add(key)
                if not self.keep_flagged:
                    self.skipped.append(
                        {
                            "source": f"{key[0]}/{name}",
                            "reason": (
                                f"{url}: the annotation flags it "
                                + " and ".join(f"{f}: 1" for f in flags)
                                + " (left out; --keep-corrupted keeps it)"
                            ),
                        }
                    )
                    return
                self.kept.append({"source": f"{key[0]}/{name}", "flags": flags, "annotation": url})
            if key not in found:
                raise ConvertError(
                    f"{url}: names pair {key[0]}/{name}, but there is no"
                    f" {_store.join(root, key[0], ifg, name)}/{png}"
                )
            if key in annotated:
                raise ConvertError(
                    f"{url}: pair {key[0]}/{name} is annotated twice (also by {annotated[key]})"
                )
            annotated[key] = url

        for url in sorted(self.listdir(_store.join(root, ann_dir), (".json",)).values()):
            self.guard(url, annotation, url)
        self._unlabelled = len(found) - len(annotated) - len(flagged - set(annotated))

        def header(key):
            frame, name = key
            files = found[key]
            h_i, h_c = raster_header(self, files["insar"]), raster_header(self, files["coherence"])
            if (h_i.height, h_i.width) != (h_c.height, h_c.width):
                raise ConvertError(
                    f"{files['coherence']}: {h_c.height}x{h_c.width} px, but {png} of pair"
                    f" {frame}/{name} is {h_i.height}x{h_i.width}"
                )
            m = PAIR_RE.match(name)
            if not m:
                raise ConvertError(
                    f"{files['insar']}: the pair folder is named <primary>_<secondary>, not"
                    f" {name!r}"
                )
            return Pair(
                f"{frame}/{name}",
                frame,
                iso_date(m.group(1), name),
                iso_date(m.group(2), name),
                (("insar", files["insar"]), ("coherence", files["coherence"])),
                h_i.height,
                h_i.width,
                annotation=annotated[key],
            )

        return [
            p
            for p in map_threads(
                lambda k: self.guard(f"{k[0]}/{k[1]}", header, k), sorted(annotated), 4
            )
            if p is not None
        ]

    def extra_attrs(self, raw: str, pairs: list[Pair]) -> dict:
        """`unlabelled_pairs`: complete pairs left out for lacking an annotation, so the cube says
        why it holds fewer samples than the tree."""
        return {"unlabelled_pairs": int(getattr(self, "_unlabelled", 0))}

    @staticmethod
    def flag(d: dict, f: str, top: int, url: str) -> int | None:
        """An integer annotation field in 0..top (a bool reads as 0/1; absent or null: None)."""
        if f not in d or d[f] is None:
            return None
        v = d[f]
        if isinstance(v, bool):
            v = int(v)
        if not isinstance(v, int) or not 0 <= v <= top:
            raise ConvertError(f"{url}: field {f!r} must be an integer 0..{top}, got {v!r}")
        return v

    def classes_of(self, source: str) -> tuple[str, ...]:
        """The class names the catalog's target fed by `source` takes (lower case)."""
        return next(
            (tuple(c.lower() for c in t.classes) for t in self.targets if t.source == source), ()
        )

    def pair_labels(self, pair: Pair, bands: list[str]) -> dict[str, Any]:
        """Everything from the annotation JSON (the PNGs are renderings): polygons give box and
        mask; `label` and `intensity_level` map onto the catalog's classes."""
        url = pair.annotation
        d = self.load_annotation(url)

        def flag(f: str, top: int) -> int | None:
            return self.flag(d, f, top, url)

        def one_class(f: str, values: list[str], source: str, pick=None) -> int | None:
            """The index of the class the field names (`pick` chooses among several; None: several,
            none chosen)."""
            classes = self.classes_of(source)
            if not classes or not values:
                return None
            idx = []
            for v in values:
                k = v.strip().lower().replace("non_deformation", "none").replace(" ", "_")
                if k not in classes:
                    raise ConvertError(
                        f"{url}: field {f!r} has {v!r}, which is none of the classes of target"
                        f" {source} ({', '.join(classes)}; the catalog's targets.{source}.classes)"
                    )
                idx.append(classes.index(k))
            idx = sorted(set(idx))
            return idx[0] if len(idx) == 1 else pick(idx) if pick else None

        labels = d.get("label") or []
        labels = [labels] if isinstance(labels, str) else [str(x) for x in labels]
        box = polygon_box(d.get("segmentation_mask"), url)
        if box is not None:
            box = self.check_box(box, pair, url, "segmentation_mask")
        deformation = [x for x in labels if x != "Non_Deformation"]

        def words(f: str) -> str:
            v = d.get(f)
            return ", ".join(str(x) for x in v) if isinstance(v, list) else str(v or "")

        answers = {}
        if deformation:
            answers["deformation_localization"] = str(
                self.option("description", "{label}", str)
            ).format(
                label=", ".join(deformation),
                activity_type=words("activity_type"),
                intensity_level=words("intensity_level"),
                phase=words("phase"),
            )
        if str(d.get("caption") or "").strip():
            answers["noise_assessment"] = str(d["caption"]).strip()
        if str(d.get("caption") or "").strip():
            answers["caption"] = str(d["caption"]).strip()
        levels = d.get("intensity_level") or []
        levels = [levels] if isinstance(levels, str) else [str(x) for x in levels]
        q = {
            "low_coherence": flag("low_coherence", 1),
            "atmospheric_fringes": flag("atmospheric_fringes", 3),
            "deformation": (1 if deformation else 0) if labels else None,
            # one deformation type per sample: none, or the one type its labels name (several
            # types: no reference)
            "deformation_type": one_class("label", deformation or labels, "deformation_type"),
            # several events: the strongest listed level
            "intensity": one_class("intensity_level", levels, "intensity", pick=max),
        }
        # the mask: polygons rasterised; "no deformation" = all 0; a deformation label without
        # polygons says nothing
        # about where (no mask label)
        if box is not None:
            mask, mask_origin = (
                polygon_mask(polygons(d.get("segmentation_mask"), url), pair.height, pair.width),
                "annotation_polygons",
            )
        elif labels and not deformation:
            mask, mask_origin = np.zeros((pair.height, pair.width), np.int8), "annotation_polygons"
        else:
            mask, mask_origin = None, "none"
        return {
            "quantities": q,
            "box": box,
            "box_origin": "annotation" if labels or box else "none",
            "mask": mask,
            "mask_origin": mask_origin,
            "answers": {k: v for k, v in answers.items() if k in self.text_tasks},
            "wavelength_m": self.wavelength_m,
        }

    def read_sample(self, pair: Pair, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """InSAR.png's RGB plus Coherence.png's grey level, 0..255 as rendered (a grey InSAR.png is
        repeated to RGB), padded to the cube's shape."""
        rgb = read_raster(self, pair.file("insar")).astype(np.float32)
        if rgb.shape[0] == 1:
            rgb = np.repeat(rgb, 3, axis=0)
        grey = (
            read_raster(self, pair.file("coherence"))[:3]
            .astype(np.float32)
            .mean(axis=0, keepdims=True)
        )
        return pad_to(np.concatenate([rgb[:3], grey]), shape)

    # -- sample data ----------------------------------------------------------------------------
    def write_pair(
        self, root: str, pair, annotate: bool = True, boxes: bool = True, index: int = 0
    ) -> tuple[str, dict]:
        """Write one generated pair (insar_synthetic.IfgPair) as renderings + an annotation; returns
        (sample id, paths)."""
        import json

        ifg, png, coh, ann_dir = self.names
        name = f"{pair.primary.replace('-', '')}_{pair.secondary.replace('-', '')}"
        folder = os.path.join(root, pair.frame, ifg, name)
        os.makedirs(folder, exist_ok=True)
        paths = {"insar": os.path.join(folder, png), "coherence": os.path.join(folder, coh)}
        write_png(paths["insar"], render_phase(pair.wrapped))
        write_png(
            paths["coherence"],
            np.repeat(np.rint(pair.coherence * 255)[None], 3, axis=0).astype(np.uint8),
        )
        if annotate:
            label = {"mogi": ["Mogi"], "dislocation": ["Earthquake"], "none": ["Non_Deformation"]}[
                pair.source
            ]
            x0, y0, x1, y1 = pair.box if pair.box is not None else (0, 0, 0, 0)
            ann = {
                "uniqueID": index,
                "frameID": pair.frame,
                "primary_date": pair.primary.replace("-", ""),
                "secondary_date": pair.secondary.replace("-", ""),
                "corrupted": 0,
                "processing_error": 0,
                "glacier_fringes": 0,
                "orbital_fringes": 1,
                "atmospheric_fringes": pair.atmosphere_level,
                "low_coherence": int(pair.coherence_class == 0),
                "no_info": 0,
                "image_artifacts": 0,
                "label": label,
                "activity_type": label if pair.source != "none" else [],
                "intensity_level": [("None", "Low", "Medium", "High")[min(pair.fringes, 3)]],
                "phase": "Unrest" if pair.source != "none" else "Rest",
                "confidence": 0.9,
                "segmentation_mask": (
                    [[x0, y0, x1, y0, x1, y1, x0, y1]] if pair.box is not None else []
                ),
                "is_crowd": 0,
                "caption": pair.answers.get("noise_assessment", ""),
            }
            os.makedirs(os.path.join(root, ann_dir), exist_ok=True)
            paths["annotation"] = os.path.join(root, ann_dir, f"{index}.json")
            with open(paths["annotation"], "w") as f:
                json.dump(ann, f, indent=1)
        return f"{pair.frame}/{name}", paths
