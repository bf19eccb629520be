"""The paired-folder layout: an image and a label raster per item in split folders, paired by name;
four of the five Cryo-Bench datasets publish this way (its options: docs/cube.md)."""

from __future__ import annotations

import os
import re
import string
import warnings

import numpy as np

from ..store import join
from .base import SPLITS, ConvertError, Mapper, Option, SourceItem, Window, pair_by_stem, register
from .rawio import WRITERS, header_threads, map_threads, raster_header, read_raster
from .writer import TileReader


@register
class PairedRasterReader(TileReader):
    name = "paired_raster"
    options_doc = (
        "images, labels (folder templates with {folder}), suffixes, bands (exact|first),"
        " split_folders, label_suffix, image_name, label_name, example_fields, val_from_train"
    )

    # folder templates (required), `{folder}` being the split folder on disk
    image_dir = Option("images", kind=str)
    label_dir = Option("labels", kind=str)
    # suffixes read, lower case (default GeoTIFF); sample data is written with the first
    suffixes = Option("suffixes", [".tif", ".tiff"], list, lambda v: tuple(s.lower() for s in v))
    # what a mask's stem adds to its image's (CaFFe original's `_zones`)
    label_suffix = Option("label_suffix", "", str)
    # template of an image stem's parts, from which `label_name` builds
    image_name = Option("image_name", "{stem}", str)
    # `exact` band count, or `first`: more bands are fine and the first N are read (GLID)
    band_policy = Option("bands", "exact", str, choices=("exact", "first"))

    @property
    def split_folders(self) -> dict[str, str]:
        """Folder on disk -> split (default train/val/test); any other split is refused."""
        folders = self.option("split_folders", {s: s for s in SPLITS}, dict)
        bad = sorted(set(folders.values()) - set(SPLITS))
        if bad:
            raise ConvertError(f"{self.where}: split_folders maps to {bad}, not one of {SPLITS}")
        return {str(k): str(v) for k, v in folders.items()}

    @property
    def label_name(self) -> str:
        """Template of a mask's stem from the image stem's parts; default stem + `label_suffix`."""
        return self.option("label_name", "{stem}" + self.label_suffix, str)

    def _name_fields(self, stem: str, where: str) -> dict[str, str]:
        """The parts of an image stem by `image_name` (non-greedy but the last), or an error."""
        parts = list(string.Formatter().parse(self.image_name))
        pattern = "".join(
            re.escape(lit)
            + (f"(?P<{f}>.+)" if i == len(parts) - 1 else f"(?P<{f}>.+?)" if f else "")
            for i, (lit, f, _, _) in enumerate(parts)
        )
        m = re.fullmatch(pattern, stem)
        if m is None:
            raise ConvertError(
                f"{where}: the name {stem!r} does not follow the {self.layout.name!r} layout's "
                f"image names ({self.image_name}); pass the --layout it was published in"
            )
        return m.groupdict()

    def label_stem(self, stem: str, where: str = "") -> str:
        """The mask stem of an image stem; a name of another layout's naming suggests --layout."""
        return self.label_name.format(**self._name_fields(stem, where or stem))

    def example_name(self, base: str, i: int) -> str:
        """A file stem in this layout's naming for generated sample data (`base` becomes {stem})."""
        extra = {k: str(v).format(i=i) for k, v in self.option("example_fields", {}, dict).items()}
        return self.image_name.format(stem=base, **extra)

    def dirs(self, root: str, folder: str) -> tuple[str, str]:
        """The image and the label folder of split folder `folder` on disk."""
        return tuple(join(root, d.format(folder=folder)) for d in (self.image_dir, self.label_dir))

    def detect(self, root: str) -> bool:
        """Its folders exist and masks follow its naming (CaFFe's two layouts differ only there)."""
        for f in self.split_folders:
            if all(self.isdir(d) for d in self.dirs(root, f)):
                images, labels = (self.listdir(d, self.suffixes) for d in self.dirs(root, f))
                if not images or not labels:
                    return True
                try:
                    return any(self.label_stem(s) in labels for s in list(images)[:50])
                except ConvertError:  # image names of another layout
                    return False
        return False

    def _unread_folders(self, root: str) -> list[str]:
        """Image folders beside the split folders this layout does not read, so they are named."""
        parent = self.image_dir.split("{folder}")[0].rstrip("/")
        fs, path = self.fs(join(root, parent) if parent else root)
        if not fs.isdir(path):
            return []
        out = []
        for p in sorted(fs.ls(path, detail=False)):
            name = p.rstrip("/").rsplit("/", 1)[-1]
            if name in self.split_folders or name.startswith("."):
                continue
            img_dir = self.dirs(root, name)[0]
            if self.isdir(img_dir) and self.listdir(img_dir, self.suffixes):
                out.append(img_dir)
        return out

    def _folders(self, root: str) -> list[tuple[str, str]]:
        """[(folder, split)] present under root; two folders for one split is ambiguous."""
        found: dict[str, str] = {}
        for folder, split in self.split_folders.items():
            if any(self.isdir(d) for d in self.dirs(root, folder)):
                if split in found:
                    raise ConvertError(
                        f"{root}: both {found[split]!r} and {folder!r} look like the {split} split;"
                        " keep one"
                    )
                found[split] = folder
        return [(folder, split) for split, folder in found.items()]

    def scan(self, root: str, map_headers: Mapper | None = None) -> list[SourceItem]:
        """Images and masks paired by name per split folder, headers checked, val drawn if asked."""
        unread = self._unread_folders(root)
        if unread:
            splits = ", ".join(sorted(set(self.split_folders)))
            drawn = (
                "; its val split is drawn from train" if self.options.get("val_from_train") else ""
            )
            warnings.warn(
                f"{', '.join(unread)}: not read (the {self.spec.id} {self.layout.name!r} layout"
                f" reads the split folders {splits}{drawn}); pass --layout for a layout that has"
                " them",
                stacklevel=2,
            )
        jobs = []
        for folder, split in self._folders(root):
            img_dir, lbl_dir = self.dirs(root, folder)
            images, labels = (self.listdir(d, self.suffixes) for d in (img_dir, lbl_dir))
            if self.label_name != "{stem}":  # key masks by the image stem they belong to
                by_label = {self.label_stem(s, images[s]): s for s in images}
                labels = {by_label.get(s, s): u for s, u in labels.items()}
            jobs += [(split, *p) for p in pair_by_stem(images, labels, f"{img_dir} vs {lbl_dir}")]
        if not jobs:
            raise ConvertError(
                f"{root}: no {self.spec.id} files in the {self.layout.name!r} layout (expected"
                f" {self.image_dir.format(folder='<split>')}/* and"
                f" {self.label_dir.format(folder='<split>')}/*)"
            )
        return self.drawn((map_headers or map_threads)(self._item, jobs, header_threads(root)))

    def _item(self, job: tuple[str, str, str, str]) -> SourceItem:
        split, stem, img, lbl = job
        hi, hl = raster_header(self, img), raster_header(self, lbl)
        want = len(self.spec.bands)
        if hi.bands != want and not (self.band_policy == "first" and hi.bands > want):
            need = f"at least {want}" if self.band_policy == "first" else str(want)
            raise ConvertError(
                f"{img}: {hi.bands} band(s), but {self.spec.id} needs {need}"
                f" ({', '.join(self.spec.band_names)})"
            )
        if (hi.height, hi.width) != (hl.height, hl.width):
            raise ConvertError(
                f"{img} is {hi.height}x{hi.width} but its mask {lbl} is {hl.height}x{hl.width}"
            )
        return SourceItem(split, stem, img, lbl, hi.height, hi.width, want, hi.crs, hi.transform)

    def read(self, item: SourceItem, window: Window | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The image's catalog bands (the first N under `bands: first`), the mask's band 1."""
        image = read_raster(self, item.image, window, bands=len(self.spec.bands))
        return image, read_raster(self, item.label, window, bands=1)[0]

    # -- sample data ---------------------------------------------------------------------------
    def write(self, root, split, scene, image, raw_label, crs=None, transform=None):
        """Sample data where `scan` finds it: its split's disk folder, the first suffix,
        `label_name`; PNG layouts get no CRS or transform (PNG has none)."""
        folder = next(f for f, s in self.split_folders.items() if s == self.disk_split(split))
        img_dir, lbl_dir = self.dirs(str(root), folder)
        ext = self.suffixes[0]
        img, lbl = join(img_dir, f"{scene}{ext}"), join(lbl_dir, f"{self.label_stem(scene)}{ext}")
        if not img.endswith((".tif", ".tiff")):
            crs = transform = None  # PNG carries no georeferencing
        for path, arr in ((img, image), (lbl, raw_label.astype(np.uint8))):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            WRITERS[os.path.splitext(path)[1]](path, arr, crs, transform)
        return img, lbl
