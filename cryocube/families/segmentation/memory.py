"""The memory a fine-tuning run's fit task needs at least, from the model config alone: the engine
refuses a run that exceeds a worker's (engine/evaluate.py `check_memory`) before it starts instead
of the nanny restarting its worker until `KilledWorker` (docs/performance.md: against a peak)."""

from __future__ import annotations

GIB = 2**30
# a worker with torch, timm and the cube readers loaded, before any model
WORKER_BASE_BYTES = int(1.0 * GIB)
# fp32 weights + gradients + AdamW exp_avg + exp_avg_sq + the best state's copy
TRAINED_BYTES_PER_PARAM = 4 + 4 + 8 + 4
# values per token and width a transformer block keeps for backward (norms, qkv, attention output,
# projection, the 4x MLP in and out): about 16
SAVED_PER_TOKEN_WIDTH = 16


def finetune_bytes(
    params_m: float | None, arch: dict, input_size: int, batch: int, bf16: bool
) -> int:
    """At least this many bytes in the fit task of a run that trains its encoder (0: unknown)."""
    if not params_m:
        return 0
    params = params_m * 1e6
    weights = params * (TRAINED_BYTES_PER_PARAM + (2 if bf16 else 0))
    width, depth, patch = (arch.get(k) for k in ("embed_dim", "depth", "patch_size"))
    acts = 0.0
    if all(isinstance(v, int) and v > 0 for v in (width, depth, patch)):
        tokens = (input_size // patch) ** 2 + 1
        acts = batch * depth * tokens * width * SAVED_PER_TOKEN_WIDTH * (4 + (2 if bf16 else 0))
    return int(WORKER_BASE_BYTES + weights + acts)
