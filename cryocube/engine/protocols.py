"""Protocols (frozen, few-shot, fine-tune, cross-sensor) and the training recipe they share.

Defaults are the Cryo-Bench/PANGAEA recipe; every field can be overridden from YAML or `--set k=v`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

from ..errors import UserError


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 80
    lr: float = 1e-4
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    batch_size: int = 8
    milestones: tuple[float, float] = (0.6, 0.9)  # fractions of all iterations, LR x gamma at each
    gamma: float = 0.1
    val_every: int = 5  # validate before epochs 0, 5, ... and after the last
    decoder: str = "upernet"
    decoder_channels: int = 512
    crops_per_sample: int = 4  # size of the fixed bank of random training crops (frozen protocols)
    feature_dtype: str = "float16"  # storage of cached features
    input_size: int | None = None  # override the encoder's input size (e.g. small test tiles)
    normalization: str = "cube"  # "cube": train-split stats of the cube; "published": the catalog's
    few_shot_bins: int = 3
    block_samples: int = 8  # samples per Dask task when extracting features / testing
    threads: int | None = None  # torch threads per task (default: the worker's threads)
    max_val_samples: int | None = None  # cap validation cost on big datasets (None = all)
    cache_in_memory_mb: float = 1024  # cached features smaller than this are read once per run, else streamed
    encoder_weights: dict[str, str] = field(default_factory=dict)  # model id -> path/URL

    def replace(self, **kw) -> TrainConfig:
        return dataclasses.replace(self, **kw)

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        d["milestones"] = list(self.milestones)
        return d


def load_config(path: str | None = None, overrides: list[str] | None = None, base: TrainConfig | None = None) -> TrainConfig:
    """TrainConfig from defaults, then a YAML file, then `key=value` overrides (YAML-typed values)."""
    cfg = base or TrainConfig()
    values: dict[str, Any] = {}
    if path:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
        if not isinstance(data, dict):
            raise UserError(f"{path}: a config must be a mapping of recipe fields")
        values.update(data.get("train", data))
    for item in overrides or []:
        if "=" not in item:
            raise UserError(f"--set {item!r}: expected key=value")
        k, v = item.split("=", 1)
        values[k.strip()] = yaml.safe_load(v)
    known = {f.name: f for f in dataclasses.fields(TrainConfig)}
    bad = sorted(set(values) - set(known))
    if bad:
        raise UserError(f"unknown recipe fields {bad}; known: {sorted(known)}")
    for k in ("betas", "milestones"):
        if k in values:
            values[k] = tuple(values[k])
    return cfg.replace(**values)


@dataclass(frozen=True)
class Protocol:
    name: str
    trains_encoder: bool  # True: fine-tuning; the encoder runs in the training loop
    band_mode: str  # band-matching rule, see cryocube.models.match_bands
    fraction: float  # default share of training labels
    description: str


PROTOCOLS: dict[str, Protocol] = {
    p.name: p
    for p in (
        Protocol("frozen", False, "protocol", 1.0, "frozen encoder + decoder, all training labels"),
        Protocol("fewshot", False, "protocol", 0.1, "frozen encoder + decoder, stratified share of training labels"),
        Protocol("finetune", True, "protocol", 1.0, "encoder and decoder trained together"),
        Protocol("cross_sensor", False, "cross_sensor", 1.0, "frozen encoder; SAR/grey fed to optical encoders as RGB"),
    )
}


def get_protocol(name: str) -> Protocol:
    if name not in PROTOCOLS:
        raise UserError(f"unknown protocol {name!r}; known: {', '.join(PROTOCOLS)}")
    return PROTOCOLS[name]


def stratified_subset(strata: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Few-shot subset as the reference samples it: from each stratum (in order of first appearance)
    max(1, int(n * fraction)) samples without replacement. Indices are positions in `strata`."""
    strata = np.array([str(v) for v in np.asarray(strata).ravel()], dtype=object)
    if fraction >= 1.0:
        return np.arange(strata.size)
    rng = np.random.default_rng(seed)
    order = list(dict.fromkeys(strata.tolist()))
    chosen = []
    for s in order:
        members = np.flatnonzero(strata == s)
        take = int(max(1, members.size * fraction))
        chosen.append(np.sort(rng.choice(members, size=take, replace=False)))
    return np.sort(np.concatenate(chosen)) if chosen else np.arange(0)


def sliding_offsets(length: int, window: int) -> list[int]:
    """Window offsets along one axis: ceil(L / S) windows spread evenly, the last flush with the edge."""
    if length <= window:
        return [0]
    n = int(np.ceil(length / window))
    return [int(round(v)) for v in np.linspace(0, length - window, n)]
