"""SSL4EO-S12-downstream (Embed2Scale / NeuCo-Bench): zipped Zarr v2 stores per location and
modality -> one multi-temporal sample cube, modalities side by side (docs/embeddings.md)."""

from __future__ import annotations

import csv
import os
import posixpath
import tempfile
import warnings
from dataclasses import dataclass

import numpy as np
import xarray as xr
import zarr

from .. import store as _store
from ..cube import SamplePlan
from ..labelfiles import read_label_folder, strip_id
from .base import ConvertError, Option, register, texts
from .rawio import checked_read
from .samples import SampleReader

S2_OFFSET = 1000.0
SHIFTED_STATS = "ssl4eo_v11_shifted"


@dataclass(frozen=True)
class Location:
    """One location: its id and the URL of its store per modality."""

    id: str
    files: tuple[tuple[str, str], ...]  # (modality, url)


@register
class SSL4EOReader(SampleReader):
    name = "ssl4eo_zarr_zip"
    options_doc = "modalities (folders under data/, in band order), variable"

    # folders under `data/`, in the order of their bands on the cube's band axis
    modalities = Option("modalities", kind=list, convert=texts)
    # the Zarr variable holding the pixels in every store
    variable = Option("variable", "bands", str)

    def band_slices(self) -> dict[str, slice]:
        """Where each modality's bands sit on the band axis (the catalog's `sensor` field)."""
        out, i = {}, 0
        for m in self.modalities:
            n = sum(1 for b in self.spec.bands if b.sensor == m)
            if n == 0:
                raise ConvertError(
                    f"{self.where}: modality {m!r} has no band in the catalog (bands' sensor field)"
                )
            out[m] = slice(i, i + n)
            i += n
        if i != len(self.spec.bands):
            raise ConvertError(
                f"{self.where}: the catalog's bands are not grouped by modality in the order"
                f" {self.modalities}"
            )
        return out

    def detect(self, root: str) -> bool:
        """Every modality folder exists under `data/`."""
        return all(self.isdir(_store.join(root, "data", m)) for m in self.modalities)

    def scan(self, root: str) -> list[Location]:
        """Locations by id across modality folders; one missing a modality is refused."""
        by_mod = {
            m: {
                strip_id(posixpath.basename(u)): u
                for u in self.glob(root, f"data/{m}/*/*.zarr.zip").values()
            }
            for m in self.modalities
        }
        if not any(by_mod.values()):
            raise ConvertError(
                f"{root}: no SSL4EO-S12-downstream stores (expected"
                f" data/<{'|'.join(self.modalities)}>/part-*/<id>.zarr.zip)"
            )
        ids = sorted(set().union(*by_mod.values()))
        for m, found in by_mod.items():
            lonely = [i for i in ids if i not in found]
            if lonely:
                raise ConvertError(
                    f"{root}: {len(lonely)} location(s) have no {m} store, e.g. {lonely[0]} "
                    f"(expected data/{m}/part-*/{lonely[0]}.zarr.zip)"
                )
        return [Location(i, tuple((m, by_mod[m][i]) for m in self.modalities)) for i in ids]

    def _pixels(self, url: str) -> np.ndarray:
        """A store's `variable` as float32; a remote zip is read from a temporary copy."""
        tmp = None
        if _store.is_remote(url):
            with tempfile.NamedTemporaryFile(suffix=".zarr.zip", delete=False) as f:
                f.write(self.open_bytes(url))
            tmp = f.name
        st = zarr.storage.ZipStore(tmp or _store.local_path(url), mode="r")
        try:  # a truncated zip or chunk fails in zarr
            g = checked_read(url, "store", lambda: zarr.open_group(st, mode="r"))
            if self.variable not in g:
                raise ConvertError(
                    f"{url}: no variable {self.variable!r} (found {sorted(g.keys())})"
                )
            return checked_read(url, "store", lambda: np.asarray(g[self.variable][:], np.float32))
        finally:
            st.close()
            if tmp:
                os.unlink(tmp)

    def read_sample(self, item: Location, shift_s2: bool = False) -> np.ndarray:
        """(time, band, y, x) float32, modalities side by side in catalog band order, S2 shifted
        by +1000 DN when asked."""
        parts = []
        slices = self.band_slices()
        for m, url in item.files:
            a = self._pixels(url)
            if a.ndim != 5 or a.shape[0] != 1:
                raise ConvertError(
                    f"{url}: {self.variable} has shape {a.shape}, expected (1, time, band, y, x)"
                )
            want = slices[m].stop - slices[m].start
            if a.shape[2] != want:
                raise ConvertError(f"{url}: {a.shape[2]} {m} bands, the catalog lists {want}")
            a = a[0]
            if shift_s2 and m.startswith("s2"):
                a = a + S2_OFFSET
            parts.append(a)
        shapes = {p.shape[::2] for p in parts}
        if len(shapes) != 1:
            raise ConvertError(
                f"location {item.id}: modalities differ in time steps or size"
                f" {[p.shape for p in parts]}"
            )
        return np.concatenate(parts, axis=1)

    def write(self, root, split, scene, image, raw_label=None, crs=None, transform=None):
        """Sample data: one location's store per modality."""
        paths = []
        for m, sl in self.band_slices().items():
            path = os.path.join(str(root), "data", m, "part-000000", f"{scene}.zarr.zip")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            arr = image[None, :, sl].astype(np.float16 if m == "s1" else np.uint16)
            ds = xr.Dataset({self.variable: (("sample", "time", "band", "y", "x"), arr)})
            # zipfile warns about duplicate names of consolidated metadata
            with zarr.storage.ZipStore(path, mode="w") as st, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ds.to_zarr(st, zarr_format=2, consolidated=True)
            paths.append(path)
        return paths[0], paths[0]

    def write_labels(self, root, tasks: dict[str, tuple[str, dict[str, float | None]]]) -> None:
        """Sample data: `labels/<task>__<kind>.csv` as NeuCo-Bench publishes them."""
        os.makedirs(os.path.join(str(root), "labels"), exist_ok=True)
        for task, (kind, values) in tasks.items():
            path = os.path.join(str(root), "labels", f"{task}__{kind}.csv")
            with open(path, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["id", "label"])
                for i, v in values.items():
                    w.writerow([i, "" if v is None else repr(float(v))])

    # -- the sample cube -------------------------------------------------------------------------
    def read_kwargs(self, plan: SamplePlan) -> dict:
        """The plan's `shift_s2`, so workers apply the offset its statistics were chosen for."""
        return {"shift_s2": bool(plan.attrs["shift_s2"])}

    def plan(
        self, raw: str, on_error: str = "raise", keep_corrupted: bool = False, shift_s2=False, **_
    ) -> tuple[list[Location], SamplePlan]:
        """The first location sets the (square) shape; labels of unknown ids are ignored."""
        items = self.scan(raw)
        # task -> (kind, {id: label}) by the probe's strict reader, so both see the same labels
        found = read_label_folder(_store.join(raw, "labels"), self.storage_options)
        tasks = {t: (f.kind, f.labels) for t, f in found.items()}
        first = self.read_sample(items[0], shift_s2=shift_s2)
        T, C, H, W = first.shape
        if H != W:
            raise ConvertError(
                f"location {items[0].id}: {H}x{W} pixels; sample cubes hold square images"
            )
        index = {it.id: i for i, it in enumerate(items)}
        target = np.full((len(items), len(tasks)), np.nan, dtype=np.float32)
        for j, (_, values) in enumerate(tasks.values()):
            for i in values.keys() & index.keys():
                target[index[i], j] = values[i]
        pub = self.spec.statistics.get(SHIFTED_STATS) if shift_s2 else None
        return items, SamplePlan(
            ids=[it.id for it in items],
            shape=first.shape,
            tasks=[(t, kind) for t, (kind, _) in tasks.items()],
            target=target,
            attrs={
                "shift_s2": shift_s2,
                "published_statistics": (
                    SHIFTED_STATS if shift_s2 else "raw (catalog band mean/std)"
                ),
            },
            fingerprint={"shift_s2": shift_s2},
            time=tuple(self.spec.time),
            published_mean=[pub[b.name][0] for b in self.spec.bands] if pub else None,
            published_std=[pub[b.name][1] for b in self.spec.bands] if pub else None,
        )
