"""The vqa family's recipe fields over the shared ones (cryocube/recipe.py): `--set gen_batch=4`,
`--set vqa_tasks=coherence_classification,fringe_counting`, `--set blind=true`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...mapping import rule
from ...recipe import BaseRecipe
from ..recipes import QuestionRecipe


@dataclass(frozen=True, kw_only=True)
class VqaRecipe(QuestionRecipe):
    # prompts per generate() call (left-padded); batching can move the last bits: in the run id
    gen_batch: int = rule(8, lo=1)
    max_new_tokens: int | None = rule(None, lo=1)  # a cap on every task's own (None: theirs)
    blind: bool = False  # the blind baseline: every picture a blank one of the same size

    EXECUTION_FIELDS: ClassVar[dict[str, str]] = {
        **BaseRecipe.EXECUTION_FIELDS,
        # the vqa family builds no encoder: these shared fields configure nothing of its runs
        "normalization": "a generative model's own processor normalises its pictures",
        "input_size": "a generative model's own processor sizes its pictures",
        "extract_batch": "prompts are batched by gen_batch, which is in the run id",
        "encoder_weights": "a generative model names its checkpoint in the model reference",
    }
