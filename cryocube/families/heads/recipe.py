"""The heads family's own recipe field, `vqa_tasks`: a VLM and an encoder answer the same tasks."""

from __future__ import annotations

from dataclasses import dataclass

from ...mapping import names, rule
from ...recipe import BaseRecipe


@dataclass(frozen=True, kw_only=True)
class HeadsRecipe(BaseRecipe):
    # () = every catalog task about the cube's kind with a class/number/box answer
    vqa_tasks: tuple[str, ...] | str = rule((), what="task names (a list or 'a,b')")

    @property
    def task_names(self) -> list[str]:
        """vqa_tasks as a list, from 'a,b' (--set) or YAML; empty means every answerable task."""
        return names(self.vqa_tasks)
