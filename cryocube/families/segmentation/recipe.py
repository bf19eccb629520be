"""The segmentation family's recipe: the shared fields (cryocube/recipe.py) plus the training
protocol's.

The defaults are the Cryo-Bench/PANGAEA recipe in catalogs/benchmarks/cryobench.yaml (`recipe:`);
every field can be overridden from YAML (`--config`) or `--set k=v`, and is checked here before any
cluster starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...recipe import (
    BaseRecipe,
    RecipeError,
    check_choice,
    check_int,
    check_num,
)  # noqa: F401 (RecipeError: its users)

MEMORY_FORMATS = ("auto", "channels_last", "contiguous")
FEATURE_DTYPES = ("float16", "float32")


@dataclass(frozen=True, kw_only=True)
class SegmentationRecipe(BaseRecipe):
    # the protocol's values (defaults: the benchmark catalog's recipe)
    epochs: int
    lr: float
    weight_decay: float
    betas: tuple[float, float]
    batch_size: int
    milestones: tuple[float, ...]  # fractions of all iterations, LR x gamma at each
    gamma: float
    val_every: int  # validate before epochs 0, val_every, ... and after the last
    decoder: str
    decoder_channels: int
    few_shot_bins: int
    # cryocube's engineering (not part of the reference recipe)
    crops_per_sample: int = 4  # size of the fixed bank of random training crops (frozen protocols)
    feature_dtype: str = "float16"  # storage of cached features
    # channels_last where it measures faster (CUDA; bf16 on AMX CPUs), else contiguous
    memory_format: str = "auto"
    max_val_samples: int | None = None  # cap validation cost on big datasets (None = all)
    # cached features smaller than this are read once per task, else streamed
    cache_in_memory_mb: float = 1024
    # frozen runs sharing a feature cache train together, up to this many per task
    decoders_per_task: int = 8

    EXECUTION_FIELDS: ClassVar[dict[str, str]] = {
        **BaseRecipe.EXECUTION_FIELDS,
        "cache_in_memory_mb": "whether cached features are read once or streamed",
        "decoders_per_task": "how many runs on one feature cache share a task",
        # it can move the best epoch: a cap kept out of the run id as it was when added
        "max_val_samples": "a cost cap on validation, outside the run id since it was added",
    }
    TUPLE_FIELDS: ClassVar[tuple[str, ...]] = ("betas", "milestones")
    FLOAT_FIELDS: ClassVar[tuple[str, ...]] = ("lr", "weight_decay", "gamma", "cache_in_memory_mb")

    def validate(self) -> None:
        """The training protocol's checks on top of the shared ones, run before any cluster starts;
        RecipeError names the field."""
        super().validate()
        check_int("epochs", self.epochs)
        check_num("lr", self.lr, 0.0, lo_open=True)
        check_num("weight_decay", self.weight_decay, 0.0)
        if len(self.betas) != 2:
            raise RecipeError(f"recipe field betas must be two numbers, got {list(self.betas)!r}")
        for b in self.betas:
            check_num("betas", b, 0.0, hi=1.0, hi_open=True)
        check_int("batch_size", self.batch_size)
        for m in self.milestones:
            check_num("milestones", m, 0.0, lo_open=True, hi=1.0)
        if list(self.milestones) != sorted(self.milestones):
            raise RecipeError(
                "recipe field milestones must be increasing fractions of the iterations, got"
                f" {list(self.milestones)!r}"
            )
        check_num("gamma", self.gamma, 0.0, lo_open=True)
        check_int("val_every", self.val_every)
        if not isinstance(self.decoder, str) or not self.decoder:
            raise RecipeError(f"recipe field decoder must be a decoder name, got {self.decoder!r}")
        check_int("decoder_channels", self.decoder_channels)
        check_int("few_shot_bins", self.few_shot_bins)
        check_int("crops_per_sample", self.crops_per_sample)
        check_choice("feature_dtype", self.feature_dtype, FEATURE_DTYPES)
        check_choice("memory_format", self.memory_format, MEMORY_FORMATS)
        check_int("max_val_samples", self.max_val_samples, none=True)
        check_num("cache_in_memory_mb", self.cache_in_memory_mb, 0.0)
        check_int("decoders_per_task", self.decoders_per_task)


def load_recipe(*args, **kw):
    """The recipe of every family (`cryocube.load_recipe`); kept here for code that imported it from
    here."""
    from ..recipes import load_recipe as load

    return load(*args, **kw)
