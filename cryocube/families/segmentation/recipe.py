"""The segmentation recipe: the shared fields plus the Cryo-Bench/PANGAEA training protocol's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...mapping import rule
from ...recipe import BaseRecipe, RecipeError

MEMORY_FORMATS = ("auto", "channels_last", "contiguous")
FEATURE_DTYPES = ("float16", "float32")
_COUNT = {"lo": 1}  # an integer >= 1
_POSITIVE = {"lo": 0.0, "lo_open": True}  # a number > 0


@dataclass(frozen=True, kw_only=True)
class SegmentationRecipe(BaseRecipe):
    # the protocol's values (defaults: the benchmark catalog's recipe)
    epochs: int = rule(**_COUNT)
    lr: float = rule(**_POSITIVE)
    weight_decay: float = rule(lo=0.0)
    betas: tuple[float, float] = rule(lo=0.0, hi=1.0, hi_open=True)
    batch_size: int = rule(**_COUNT)
    # fractions of all iterations, LR x gamma at each
    milestones: tuple[float, ...] = rule(lo=0.0, lo_open=True, hi=1.0)
    gamma: float = rule(**_POSITIVE)
    val_every: int = rule(**_COUNT)  # validate before epochs 0, val_every, ... and after the last
    decoder: str = rule(what="a decoder name")
    decoder_channels: int = rule(**_COUNT)
    few_shot_bins: int = rule(**_COUNT)
    # cryocube's engineering (not part of the reference recipe)
    crops_per_sample: int = rule(4, **_COUNT)  # the fixed bank of random training crops (frozen)
    feature_dtype: str = rule("float16", choices=FEATURE_DTYPES)  # storage of cached features
    # channels_last where it measures faster (CUDA; bf16 on AMX CPUs), else contiguous
    memory_format: str = rule("auto", choices=MEMORY_FORMATS)
    max_val_samples: int | None = rule(None, **_COUNT)  # cap validation cost (None = all)
    # cached features smaller than this are read once per task, else streamed
    cache_in_memory_mb: float = rule(1024, lo=0.0, unit="MB")
    # frozen runs sharing a feature cache train together, up to this many per task
    decoders_per_task: int = rule(8, **_COUNT)

    EXECUTION_FIELDS: ClassVar[dict[str, str]] = {
        **BaseRecipe.EXECUTION_FIELDS,
        "cache_in_memory_mb": "whether cached features are read once or streamed",
        "decoders_per_task": "how many runs on one feature cache share a task",
        # it can move the best epoch: a cap kept out of the run id as it was when added
        "max_val_samples": "a cost cap on validation, outside the run id since it was added",
    }

    def validate(self) -> None:
        """The fields' own checks, then the rules across values; RecipeError names the field."""
        super().validate()
        if list(self.milestones) != sorted(self.milestones):
            raise RecipeError(
                "recipe field milestones must be increasing fractions of the iterations, got"
                f" {list(self.milestones)!r}"
            )
        if not self.decoder:
            raise RecipeError(f"recipe field decoder must be a decoder name, got {self.decoder!r}")
