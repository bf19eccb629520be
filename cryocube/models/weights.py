"""Pretrained weights: fetch from the published URLs, verify sha256, load strictly through key maps.
Unlike the reference (warnings, strict=False), a checkpoint must fit the encoder exactly, or the
error lists the keys; what the key map declares not part of the encoder is set aside and reported.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import warnings
import zipfile
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import store
from ..decoders import build_decoder
from ..errors import WeightsError
from ..fetch import fetch, file_digest
from .registry import get_keymap
from .spec import model_spec


def cache_dir() -> Path:
    """Where fetched checkpoints go: $CRYOCUBE_WEIGHTS, else ~/.cache/cryocube/weights."""
    return Path(os.environ.get("CRYOCUBE_WEIGHTS") or Path.home() / ".cache/cryocube/weights")


@dataclass
class LoadReport:
    path: str
    loaded: int
    set_aside: list[str] = field(default_factory=list)
    computed: list[str] = field(default_factory=list)
    sha256: str | None = None
    # dropped as the reference's loader does (a followed deviation)
    dropped: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line for logs and test messages: counts only."""
        return (
            f"{self.path}: loaded {self.loaded} tensors; {len(self.set_aside)} checkpoint keys are"
            f" not part of the encoder; {len(self.computed)} recomputed at build time"
        )


def _check_sha(path: Path, sha256: str | None) -> str:
    digest = file_digest(path)
    if sha256 and digest.lower() != sha256.lower():
        raise WeightsError(
            f"{path}: sha256 {digest} does not match the expected {sha256}; the file is corrupt, "
            "truncated or a different release: delete it and fetch again"
        )
    return digest


def fetch_weights(
    model_id: str,
    dest_dir: str | Path | None = None,
    force: bool = False,
    progress: bool = True,
    url: str | None = None,
    sha256: str | None = None,
) -> Path:
    """The published checkpoint of `model_id` downloaded into `dest_dir`, verified when a sha256 is
    known; `url` (any fsspec URL: a mirror) and `sha256` replace the catalog's."""
    spec = model_spec(model_id)
    w = spec.weights
    if w is None or not spec.pretrained:
        raise WeightsError(
            f"model {model_id!r} is trained from scratch: it has no pretrained weights"
        )
    src = url or w.url
    if not src:
        raise WeightsError(f"model {model_id!r} has no public download URL. {w.notes}".strip())
    sha = sha256 or w.sha256
    dest = Path(dest_dir or cache_dir()) / (w.filename or Path(src.split("?")[0]).name)
    if dest.exists() and not force:
        _check_sha(dest, sha)
        return dest
    return fetch(src, dest, sha256=sha, progress=progress, force=True, error=WeightsError)


def _local(path_or_url: str | Path, sha256: str | None) -> Path:
    s = str(path_or_url)
    if store.is_remote(s):
        key = hashlib.sha1(s.encode()).hexdigest()[:16]
        dest = cache_dir() / "by-url" / key / Path(s.split("?")[0]).name
        # re-checks a cached copy's checksum
        fetch(s, dest, sha256=sha256, progress=False, error=WeightsError)
        return dest
    p = Path(s[7:] if s.startswith("file://") else s)
    if not p.exists():
        raise WeightsError(f"checkpoint {p} does not exist")
    return p


def read_checkpoint(path: Path, allow_pickle: bool = False) -> Any:
    """torch.load with clear errors for truncated/corrupt files and pickled non-tensor content."""
    try:
        with open(path, "rb") as f:
            return torch.load(f, map_location="cpu", weights_only=not allow_pickle)
    except pickle.UnpicklingError as e:
        if "weights only" in str(e).lower() or "weights_only" in str(e):
            raise WeightsError(
                f"{path}: the checkpoint holds pickled Python objects besides tensors; load it with"
                " allow_pickle=True (or set weights.allow_pickle in the model catalog) only if you"
                f" trust its source ({str(e).splitlines()[0]})"
            ) from None
        raise WeightsError(
            f"{path}: corrupt or truncated checkpoint ({path.stat().st_size} bytes): {e}"
        ) from None
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile, ValueError) as e:
        raise WeightsError(
            f"{path}: cannot read the checkpoint ({path.stat().st_size} bytes; truncated or not a"
            f" torch file?): {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from None


def _fmt_keys(keys: list, n: int = 25) -> str:
    shown = ", ".join(map(str, keys[:n]))
    return shown + (f", ... ({len(keys) - n} more)" if len(keys) > n else "")


def _refuse_mismatch(sd: dict, model_sd: dict, head: str, computed=()) -> None:
    """One WeightsError listing missing, unexpected and misshapen keys, before anything loads."""
    missing = sorted(set(model_sd) - set(sd) - set(computed))
    unexpected = sorted(set(sd) - set(model_sd))
    shapes = [
        f"{k} {tuple(sd[k].shape)} vs model {tuple(model_sd[k].shape)}"
        for k in sorted(set(sd) & set(model_sd))
        if tuple(sd[k].shape) != tuple(model_sd[k].shape)
    ]
    parts = [head] if missing or unexpected or shapes else []
    parts += [f"missing {len(missing)} keys: {_fmt_keys(missing)}"] if missing else []
    parts += [f"unexpected {len(unexpected)} keys: {_fmt_keys(unexpected)}"] if unexpected else []
    parts += [f"{len(shapes)} shape mismatches: {_fmt_keys(shapes, 10)}"] if shapes else []
    if parts:
        raise WeightsError("; ".join(parts))


def load_weights(
    encoder: nn.Module,
    path_or_url: str | Path,
    sha256: str | None = None,
    key_map: str | None = None,
    allow_pickle: bool | None = None,
) -> LoadReport:
    """Load a checkpoint into `encoder` strictly through the catalog's key map, or `key_map`."""
    spec = getattr(encoder, "spec", None)
    w = spec.weights if spec is not None else None
    km = get_keymap(key_map or (w.key_map if w is not None else "native"))
    if sha256 is None and w is not None and str(path_or_url) in (w.url, w.filename) and w.sha256:
        sha256 = w.sha256
    path = _local(path_or_url, sha256)
    digest = _check_sha(path, sha256) if sha256 else None
    if allow_pickle is None:
        allow_pickle = bool(w.allow_pickle) if w is not None and km.name == w.key_map else False
    ckpt = read_checkpoint(path, allow_pickle)
    try:
        sd, aside = km.to_model(ckpt, where=str(path))
    except (KeyError, ValueError) as e:
        raise WeightsError(str(e).strip("'\"")) from None
    if unused := getattr(encoder, "unused_checkpoint_keys", None):
        for k in [k for k in sd if re.fullmatch(unused, k)]:
            sd.pop(k)
            aside.append(k)
    model_sd = encoder.state_dict()
    dropped = _drop_as_reference(encoder, sd, model_sd, path)
    computed = [k for k in model_sd if any(re.fullmatch(c, k) for c in km.computed) and k not in sd]
    who = spec.id if spec is not None else type(encoder).__name__
    _refuse_mismatch(sd, model_sd, f"{path} does not fit {who} (key map {km.name!r})", computed)
    encoder.load_state_dict({**model_sd, **sd}, strict=True)
    return LoadReport(str(path), len(sd), aside, computed, digest, dropped)


def _drop_as_reference(encoder: nn.Module, sd: dict, model_sd: dict, path: Path) -> list[str]:
    """Checkpoint tensors the reference's loader drops (S12-DINO's qkv biases: it builds none and
    loads with strict=False), dropped with a warning when the run follows the reference."""
    spec = getattr(encoder, "spec", None)
    rx = getattr(spec, "drop_checkpoint_keys", None)
    if not rx:
        return []
    dropped = sorted(k for k in sd if re.fullmatch(rx, k) and k not in model_sd)
    for k in dropped:
        sd.pop(k)
    if dropped:
        warnings.warn(
            f"{path}: dropped {len(dropped)} checkpoint tensors as the Cryo-Bench reference does "
            f"(following deviations {', '.join(spec.followed)}): {_fmt_keys(dropped, 4)}",
            stacklevel=3,
        )
    return dropped


def save_encoder(encoder: nn.Module, path: str | Path) -> Path:
    """Save a (fine-tuned) encoder in our layout (load_weights' key map `native`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(encoder.state_dict(), path)
    return path


DECODER_FORMAT = "cryocube-decoder/1"


def save_decoder(decoder: nn.Module, path: str | Path, meta: dict | None = None) -> Path:
    """Save only the decoder (for frozen-encoder runs the 300M encoder is not written again)."""
    path = Path(path)
    payload = {
        "format": DECODER_FORMAT,
        "kind": getattr(decoder, "kind", type(decoder).__name__),
        "num_classes": getattr(decoder, "num_classes", None),
        "build_kwargs": dict(getattr(decoder, "build_kwargs", {}) or {}),
        "meta": dict(meta or {}),
        "state_dict": decoder.state_dict(),
    }
    with store.atomic_file(str(path)) as f:
        torch.save(payload, f)
    return path


def load_decoder(
    path: str | Path, decoder: nn.Module | None = None, encoder: nn.Module | None = None
) -> tuple[nn.Module, dict]:
    """(decoder, meta) of a save_decoder file, into `decoder` or a new one for `encoder`."""
    path = Path(path)
    if not path.exists():
        raise WeightsError(f"decoder checkpoint {path} does not exist")
    payload = read_checkpoint(path)
    if not isinstance(payload, dict) or payload.get("format") != DECODER_FORMAT:
        raise WeightsError(
            f"{path}: not a cryocube decoder checkpoint (format"
            f" {payload.get('format') if isinstance(payload, dict) else None!r})"
        )
    if decoder is None:
        if encoder is None:
            raise WeightsError(
                "load_decoder needs the decoder to fill or the encoder to build one for"
            )
        decoder = build_decoder(
            payload["kind"], encoder, int(payload["num_classes"]), **payload.get("build_kwargs", {})
        )
    sd = payload["state_dict"]
    _refuse_mismatch(sd, decoder.state_dict(), f"{path} does not fit the decoder")
    decoder.load_state_dict(sd, strict=True)
    return decoder, dict(payload.get("meta", {}))


@dataclass(frozen=True)
class WeightsInfo:
    """What a run's encoder starts from; every record carries it."""

    source: str  # checkpoint path/URL, "scratch" (by design) or "random" (a GFM without weights)
    sha256: str | None
    random_init: bool
    pretrained: bool  # the catalog calls this a pretrained model

    @property
    def path(self) -> str | None:
        """The checkpoint to load, or None: random init (scratch, or --allow-random-weights)."""
        return None if self.random_init else self.source

    def as_record(self) -> dict:
        """The `weights` field of every run record: what a result's encoder started from."""
        return asdict(self)


def checkpoint_digest(path: Path) -> str:
    """sha256 of a checkpoint, remembered beside it (keyed by size and mtime)."""
    st = path.stat()
    side = path.with_name(path.name + ".sha256")
    key = f"{st.st_size}:{st.st_mtime_ns}"
    with suppress(OSError, ValueError):
        k, digest = side.read_text().split()
        if k == key:
            return digest
    digest = file_digest(path)
    with suppress(OSError):  # a read-only weights folder: hash again next time
        side.write_text(f"{key} {digest}\n")
    return digest


def find_checkpoint(model_id: str, weights_dir: str | Path | None = None) -> str | None:
    """A fetched checkpoint of `model_id` in `weights_dir` (any fsspec URL), else the cache."""
    spec = model_spec(model_id)
    w = spec.weights
    if w is None or not spec.pretrained:
        return None
    name = w.filename or (Path(w.url.split("?")[0]).name if w.url else None)
    if not name:
        return None
    where = str(weights_dir) if weights_dir else str(cache_dir())
    if store.is_remote(where):
        url = store.join(where, name)
        return url if store.file_exists(url) else None
    p = Path(where).expanduser() / name
    return str(p) if p.is_file() else None


def _checkpoint_weights(spec, given: str) -> WeightsInfo:
    """A checkpoint (the recipe's `encoder_weights` or one found), checked against the catalog's
    sha256 if it is its file."""
    w = spec.weights
    if store.is_remote(given):
        path = _local(given, w.sha256 if w and given == w.url else None)
    else:
        path = Path(store.local_path(given))
        if not path.is_file():
            raise WeightsError(
                f"checkpoint {path} for {spec.id} (recipe field encoder_weights) does not exist"
            )
    digest = checkpoint_digest(path)
    if w and w.sha256 and digest != w.sha256.lower() and path.name == w.filename:
        raise WeightsError(
            f"{path}: sha256 {digest} does not match the catalog's {w.sha256} for {spec.id}; fetch"
            f" it again: cryocube weights fetch {spec.id} --force"
        )
    source = str(given) if store.is_remote(given) else str(path.resolve())
    return WeightsInfo(source, digest, False, spec.pretrained)


def resolve_weights(
    model_id: str,
    explicit: str | None = None,
    weights_dir: str | Path | None = None,
    allow_random: bool = False,
) -> WeightsInfo:
    """The checkpoint a run of `model_id` loads: the recipe's `encoder_weights`, else one found in
    `weights_dir` or the cache; a pretrained model without one is refused unless `allow_random`."""
    spec = model_spec(model_id)
    if not spec.pretrained and explicit is None:
        return WeightsInfo("scratch", None, True, False)
    found = explicit if explicit is not None else find_checkpoint(model_id, weights_dir)
    if found is not None:
        return _checkpoint_weights(spec, found)
    if allow_random:
        return WeightsInfo("random", None, True, True)
    where = weights_dir or cache_dir()
    how = (
        f"`cryocube weights fetch {model_id}`"
        if spec.weights and spec.weights.url
        else f"downloading it by hand ({spec.weights.notes or 'no public URL'}) into {where}"
    )
    raise WeightsError(
        f"{model_id} is a pretrained model but no checkpoint was found in {where}: get it with"
        f" {how}, pass --weights DIR or --set encoder_weights={{{model_id}: PATH}}, or pass"
        " --allow-random-weights to measure the pipeline with random weights (results then say"
        " random_init)"
    )
