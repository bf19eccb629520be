"""The adapter contract: `check` on the client before any work returns the model's provenance for
the record; on a worker, `generate` answers pictures (H, W, 3 uint8) and prompts greedily."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar


def split_ref(model: str) -> tuple[str, str]:
    """`adapter[:location]` -> (adapter, location); a location may itself contain ':' (s3://...)."""
    name, _, loc = model.partition(":")
    return name, loc


@dataclass(frozen=True)
class ModelRef:
    """A generative model as tasks load it (planned on the client, travels to the workers)."""

    adapter: str
    location: str  # local folder or fsspec URL; "" for a random model
    # the random architecture built in code (--allow-random-weights), else None
    random: str | None = None
    sha256: str = ""  # of the weights (random: of the state dict as built)
    precision: str = "fp32"  # effective
    seed: int = 0


@dataclass
class Generation:
    text: str
    new_tokens: int


@dataclass
class Provenance:
    model_name: str
    model_class: str
    weights: dict[str, Any]  # source, sha256, pretrained, random_init
    facts: dict[str, Any] = field(default_factory=dict)


class Adapter(ABC):
    """Base of the adapters: one implements `check` (client) and `generate` (workers)."""

    name: ClassVar[str]

    @classmethod
    @abstractmethod
    def check(
        cls, location: str, allow_random: bool, precision: str, seed: int
    ) -> tuple[ModelRef, Provenance]:
        """On the client, before any cluster work: refuse what cannot run, in one sentence."""

    @classmethod
    def random_models(cls) -> list[str]:
        """The `adapter:random-<arch>` models `--allow-random-weights` builds (`cryocube list`)."""
        return []

    def __init__(self, ref: ModelRef, device: str):
        self.ref, self.device = ref, device

    @abstractmethod
    def generate(self, images: list, prompts: list[str], max_new_tokens: int) -> list[Generation]:
        """One `Generation` per (picture, prompt) pair, in order, the same on a rerun (greedy)."""
