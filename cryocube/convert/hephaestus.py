"""Hephaestus (CVPR 2022 EarthVision): LiCSAR interferogram renderings with human annotations; only
annotated pairs become samples, every label comes from the annotation (docs/insar-cube.md)."""

from __future__ import annotations

import math
import os
import posixpath
from typing import Any

import numpy as np

from .. import store as _store
from .base import ConvertError, register
from .insar import Pair, PairReader, iso_date, pad_to, pair_dates, write_json
from .insar_labels import polygon_mask
from .rawio import read_raster, write_png

# the release's `label` of a generated pair's deformation source
RELEASE_LABELS = {"mogi": ["Mogi"], "dislocation": ["Earthquake"], "none": ["Non_Deformation"]}


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
    """The `segmentation_mask` polygons: each flat [x1, y1, x2, y2, ...] or a list of [x, y]."""
    out = []
    for k, poly in enumerate(polys if isinstance(polys, list) else [polys] if polys else []):
        try:
            flat = [float(v) for p in poly for v in (p if isinstance(p, (list, tuple)) else [p])]
        except (TypeError, ValueError):
            flat = []
        if len(flat) < 6 or len(flat) % 2:
            raise ConvertError(
                f"{url}: field 'segmentation_mask' polygon {k} is not a list of >= 3 (x, y) points"
            )
        out.append(list(zip(flat[0::2], flat[1::2])))
    return out


def strings(v: Any) -> list[str]:
    """A field given as one string or a list of them, as a list."""
    v = v or []
    return [v] if isinstance(v, str) else [str(x) for x in v]


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
        """(interferograms, InSAR PNG, coherence PNG, annotations), the release's by default."""
        return (
            self.option("interferograms", "interferograms", str),
            self.option("insar_png", "InSAR.png", str),
            self.option("coherence_png", "Coherence.png", str),
            self.option("annotations", "annotations", str),
        )

    def frame_name(self, k: int) -> str:
        """A LiCSAR-style frame id for generated frame `k`, as in the release."""
        return f"{100 + k}D_0{4800 + k}_13{1300 + k}"

    def detect(self, root: str) -> bool:
        """An annotations folder plus at least one `<frame>/<interferograms>/<pair>/InSAR.png`."""
        ifg, png, _, ann = self.names
        return self.isdir(_store.join(root, ann)) and bool(self.glob(root, f"*/{ifg}/*/{png}"))

    def scan(self, root: str) -> list[Pair]:
        """Annotated pairs with both PNGs; flagged ones dropped unless --keep-corrupted."""
        ifg, png, coh, _ = self.names
        found = {
            f"{rel.split('/')[0]}/{posixpath.basename(rel)}": files
            for rel, files in self.pair_folders(
                root, [("insar", f"*/{ifg}/*/{png}"), ("coherence", f"*/{ifg}/*/{coh}")]
            ).items()
        }
        whole = {
            k: f for k, f in sorted(found.items()) if self.guard(k, self._complete, root, k, f)
        }
        annotated = self._annotations(root, whole, set(found) - set(whole))
        return self.each(
            lambda pid: self.pair_from_headers(
                pid,
                pair_dates(posixpath.basename(pid), pid),
                whole[pid],
                "insar",
                annotation=annotated[pid],
            ),
            sorted(annotated, key=lambda pid: pid.split("/")),  # by (frame, pair)
            lambda pid: pid,
        )

    def _complete(self, root: str, pid: str, files: dict[str, str]) -> bool:
        """Both PNGs are there and the folder's dates exist (checked before any file is read)."""
        ifg, png, coh, _ = self.names
        frame, name = pid.rsplit("/", 1)
        where = _store.join(root, frame, ifg, name)
        for what, fname in (("insar", png), ("coherence", coh)):
            if what not in files:
                raise ConvertError(
                    f"{where}: pair {pid} has no {fname} (every interferogram needs {png} and"
                    f" {coh})"
                )
        pair_dates(name, f"{where}: pair {pid}")
        return True

    def _annotations(self, root: str, found: dict, left_out: set[str]) -> dict[str, str]:
        """{pair id: annotation}; a missing or twice-annotated pair is refused."""
        ifg, png, _, ann_dir = self.names
        annotated: dict[str, str] = {}
        flagged: set[str] = set()

        def take(url: str) -> None:
            pid, flags = self._annotated_pair(url, left_out)
            if pid is None:
                return
            if flags and pid in found:
                flagged.add(pid)
                if not self.keep_flagged:
                    said = " and ".join(f"{f}: 1" for f in flags)
                    why = f"the annotation flags it {said} (left out; --keep-corrupted keeps it)"
                    self.skipped.append({"source": pid, "reason": f"{url}: {why}"})
                    return
                self.kept.append({"source": pid, "flags": flags, "annotation": url})
            if pid not in found:
                frame, name = pid.rsplit("/", 1)
                raise ConvertError(
                    f"{url}: names pair {pid}, but there is no"
                    f" {_store.join(root, frame, ifg, name)}/{png}"
                )
            if pid in annotated:
                raise ConvertError(
                    f"{url}: pair {pid} is annotated twice (also by {annotated[pid]})"
                )
            annotated[pid] = url

        for url in sorted(self.listdir(_store.join(root, ann_dir), (".json",)).values()):
            self.guard(url, take, url)
        self._unlabelled = len(found) - len(annotated) - len(flagged - set(annotated))
        return annotated

    def _annotated_pair(self, url: str, left_out: set[str]) -> tuple[str | None, list[str]]:
        """(pair id, the flags set) of an annotation; no id where its pair was already left out."""
        d = self.load_annotation(url)
        for f in ("frameID", "primary_date", "secondary_date"):
            if f not in d:
                raise ConvertError(f"{url}: missing field {f!r}")
        keys = ("primary_date", "secondary_date")
        written = f"{d['frameID']}/" + "_".join(str(d[k]).replace("-", "") for k in keys)
        if written in left_out:
            return None, []
        where = f"{url} (pair {written})"
        pid = f"{d['frameID']}/" + "_".join(iso_date(d[k], where).replace("-", "") for k in keys)
        if pid in left_out:
            return None, []
        return pid, [f for f in self.FLAGS if self.flag(d, f, 1, url)]

    def extra_attrs(self, raw: str, pairs: list[Pair]) -> dict:
        """`unlabelled_pairs`: why the cube holds fewer samples than the tree."""
        return {"unlabelled_pairs": int(getattr(self, "_unlabelled", 0))}

    @staticmethod
    def flag(d: dict, f: str, top: int, url: str) -> int | None:
        """An integer annotation field in 0..top (a bool reads as 0/1; absent or null: None)."""
        if f not in d or d[f] is None:
            return None
        v = int(d[f]) if isinstance(d[f], bool) else d[f]
        if not isinstance(v, int) or not 0 <= v <= top:
            raise ConvertError(f"{url}: field {f!r} must be an integer 0..{top}, got {v!r}")
        return v

    def one_class(self, url: str, f: str, values: list[str], source: str, pick=None) -> int | None:
        """The class index of target `source` that field `f` names (`pick` among several)."""
        classes = next(
            (tuple(c.lower() for c in t.classes) for t in self.targets if t.source == source), ()
        )
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

    def pair_labels(self, pair: Pair, bands: list[str]) -> dict[str, Any]:
        """Everything from the annotation (the PNGs are renderings)."""
        url = pair.annotation
        d = self.load_annotation(url)
        labels = strings(d.get("label"))
        deformation = [x for x in labels if x != "Non_Deformation"]
        polys = polygons(d.get("segmentation_mask"), url)
        pts = [p for poly in polys for p in poly]
        corners = (*np.min(pts, axis=0), *np.max(pts, axis=0)) if pts else None  # x0, y0, x1, y1
        box = self.check_box(corners, pair, url, "segmentation_mask")
        q = {
            "low_coherence": self.flag(d, "low_coherence", 1, url),
            "atmospheric_fringes": self.flag(d, "atmospheric_fringes", 3, url),
            "deformation": (1 if deformation else 0) if labels else None,
            # one type per sample: the one its labels name (several types: no reference)
            "deformation_type": self.one_class(
                url, "label", deformation or labels, "deformation_type"
            ),
            # several events: the strongest listed level
            "intensity": self.one_class(
                url, "intensity_level", strings(d.get("intensity_level")), "intensity", pick=max
            ),
        }
        # polygons rasterised; "no deformation" is all 0; a deformation label without polygons
        # says nothing about where (no mask label)
        mask = None
        if box is not None:
            mask = polygon_mask(polys, pair.height, pair.width)
        elif labels and not deformation:
            mask = np.zeros((pair.height, pair.width), np.int8)
        return {
            "quantities": q,
            "box": box,
            "box_origin": "annotation" if labels or box else "none",
            "mask": mask,
            "mask_origin": "none" if mask is None else "annotation_polygons",
            "answers": self._answers(d, deformation),
            "wavelength_m": self.wavelength_m,
        }

    def _answers(self, d: dict, deformation: list[str]) -> dict[str, str]:
        """The text answers: the catalog's `description` filled in, and the caption."""

        def words(f: str) -> str:
            v = d.get(f)
            return ", ".join(str(x) for x in v) if isinstance(v, list) else str(v or "")

        answers = {}
        if deformation:
            answers["deformation_localization"] = self.option("description", "{label}", str).format(
                label=", ".join(deformation),
                **{f: words(f) for f in ("activity_type", "intensity_level", "phase")},
            )
        caption = str(d.get("caption") or "").strip()
        if caption:
            answers["noise_assessment"] = answers["caption"] = caption
        return {k: v for k, v in answers.items() if k in self.text_tasks}

    def read_sample(self, pair: Pair, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """InSAR.png's RGB and Coherence.png's grey level, 0..255 as rendered, padded."""
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
    def write_pair(self, root, pair, annotate=True, boxes=True, index=0) -> tuple[str, dict]:
        """Sample data: one `insar_synthetic.IfgPair` rendered, annotated; (sample id, paths)."""
        ifg, png, coh, ann_dir = self.names
        name = self.folder_name(pair)
        folder = os.path.join(root, pair.frame, ifg, name)
        os.makedirs(folder, exist_ok=True)
        paths = {"insar": os.path.join(folder, png), "coherence": os.path.join(folder, coh)}
        write_png(paths["insar"], render_phase(pair.wrapped))
        grey = np.rint(pair.coherence * 255).astype(np.uint8)
        write_png(paths["coherence"], np.repeat(grey[None], 3, axis=0))
        if annotate:
            label = RELEASE_LABELS[pair.source]
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
            paths["annotation"] = write_json(os.path.join(root, ann_dir, f"{index}.json"), ann)
        return f"{pair.frame}/{name}", paths
