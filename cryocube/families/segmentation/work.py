"""What each segmentation task receives, typed: whole specs (the model's catalog entry, the cube's
bands), so workers need no catalog and a lab's YAML-only model or dataset runs on any cluster."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..base import content_hash
from ..encoders import EncoderSpec, InputMap
from .recipe import SegmentationRecipe


@dataclass(frozen=True)
class CacheSpec:
    """Everything that defines a frozen-feature cache; its hash names the cache."""

    encoder: EncoderSpec
    cube_url: str
    cube_checksum: str
    inputs: InputMap
    tile: int
    crops_per_sample: int
    feature_dtype: str
    root: str  # results root the cache lives under

    def _ident(self, **more) -> dict:
        return {
            "model": self.encoder.model.id,
            "cube": self.cube_checksum,
            "index": self.inputs.index,
            "mean": self.inputs.mean,
            "std": self.inputs.std,
            "S": self.encoder.input_size,
            "K": self.crops_per_sample,
            "dtype": self.feature_dtype,
            **more,
        }

    @property
    def key(self) -> str:
        """The cache's name and its runs' prep_key: what decides the features' bits (weights,
        inputs, input size, crops, dtype, arithmetic), not the decoder or seed."""
        e = self.encoder
        weights = e.weights_sha256 or e.weights
        ident = self._ident(arch=e.model.arch, rule=e.rule, weights=weights, **e.arithmetic(), v=2)
        return f"{e.model.id}-{e.rule}-{content_hash(ident, 16)}"

    @property
    def url(self) -> str:
        """Under the results root's `features/`: every run of one encoder on one cube reuses it."""
        return f"{self.root.rstrip('/')}/features/{self.key}.zarr"

    @property
    def seed(self) -> int:
        """Seed of the training crops' bank: cryocube 0.1's cache identity (rule "named" was
        "protocol"), so the crops and every frozen run's metrics stayed as they were."""
        e = self.encoder
        mode = {"named": "protocol"}.get(e.rule, e.rule)
        return int(content_hash(self._ident(mode=mode, weights=e.weights, v=1), 8), 16)


@dataclass(frozen=True)
class SegRun:
    """One planned segmentation run, as its fit and test tasks see it."""

    run_id: str
    label: str
    trains_encoder: bool  # fine-tuning and scratch baselines: on crops read from the cube
    encoder: EncoderSpec
    decoder: str
    decoder_kwargs: tuple[tuple[str, object], ...]
    num_classes: int
    class_names: tuple[str, ...]
    tile: int
    cube_url: str
    inputs: InputMap
    train_samples: np.ndarray
    val_samples: np.ndarray
    test_samples: np.ndarray
    recipe: SegmentationRecipe
    seed: int  # the run's own seed: decoder init, batch order, crops
    checkpoint: str  # where the best state goes
    cache: CacheSpec | None  # frozen runs: the feature cache they train on
    memory_format: str  # effective: channels_last | contiguous


@dataclass(frozen=True)
class ExtractTask:
    cache: CacheSpec
    split: str
    samples: np.ndarray  # cube sample indices
    per: int  # items per sample (crops or windows)
    positions: np.ndarray  # the samples' positions in the cache's split (items: position * per + k)
    batch: int | None
    threads: int | None = None  # the recipe's torch threads, else the host's cores divided


@dataclass(frozen=True)
class FitTask:
    runs: tuple[SegRun, ...]


@dataclass(frozen=True)
class TestTask:
    run: SegRun
    positions: np.ndarray  # positions of the tiles in the cache's test split
    samples: np.ndarray  # their cube sample indices
    predictions_url: str | None
    pred_range: tuple[int, int]
