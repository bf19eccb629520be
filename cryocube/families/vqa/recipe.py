"""The vqa family's own recipe fields (what to ask, how many answers per forward pass), checked before
any cluster starts. Shared fields (precision, threads, block_samples) come from the common recipe.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ...errors import UserError

FIELDS = ("tasks", "gen_batch", "max_new_tokens")


@dataclass(frozen=True)
class VqaRecipe:
    tasks: tuple[str, ...] = ()  # () = every catalog task the cube can serve
    gen_batch: int = 8  # prompts per generate() call (left-padded); batch size can move the last bits, so it is in the run id
    max_new_tokens: int | None = None  # a cap on every task's own max_new_tokens (None: the tasks' values)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def vqa_recipe(values: dict[str, Any]) -> VqaRecipe:
    unknown = set(values) - set(FIELDS)
    if unknown:
        raise UserError(f"vqa: unknown recipe field {sorted(unknown)[0]!r}; the vqa family takes {', '.join(FIELDS)}")
    tasks = values.get("tasks", ())
    if isinstance(tasks, str):
        tasks = tuple(t.strip() for t in tasks.split(",") if t.strip())
    b = values.get("gen_batch", 8)
    if isinstance(b, str) and b.isdigit():
        b = int(b)
    if not isinstance(b, int) or isinstance(b, bool) or b < 1:
        raise UserError(f"vqa: gen_batch must be a positive integer, got {b!r}")
    cap = values.get("max_new_tokens")
    if isinstance(cap, str) and cap.isdigit():
        cap = int(cap)
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        raise UserError(f"vqa: max_new_tokens must be a positive integer, got {cap!r}")
    return VqaRecipe(tasks=tuple(tasks), gen_batch=b, max_new_tokens=cap)
