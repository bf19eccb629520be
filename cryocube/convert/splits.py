"""Drawing a validation split from the train files of releases that publish none (`val_from_train`
in a layout); readers and the sample-data generator both draw here, so they agree."""

from __future__ import annotations

import math

import numpy as np

from .base import ConvertError


def shuffle_split(names: list[str], options: dict) -> set[str]:
    """The names sklearn's train_test_split(test_size=fraction, random_state=seed) holds out
    (CaFFe's reference preprocessing): a permutation of a RandomState, the first ceil(fraction n)
    are val, over the names sorted (the reference listed its files in an order we cannot see)."""
    names = sorted(names)
    n = len(names)
    if n < 2:
        return set()
    n_val = min(math.ceil(float(options.get("fraction", 0.1)) * n), n - 1)
    perm = np.random.RandomState(int(options.get("seed", 1))).permutation(n)
    return {names[i] for i in perm[:n_val]}


def choice(names: list[str], options: dict) -> set[str]:
    """RandomState(seed).choice over the sorted names, without replacement, of min(scenes, max(1, n
    // 5)) (the AutoICE starter kit's 10 scenes on the real 512-scene train set; the n // 5 cap
    keeps most of a tiny set for training)."""
    names = sorted(names)
    n = len(names)
    k = min(int(options.get("scenes", 10)), max(1, n // 5)) if n >= 2 else 0
    if k == 0:
        return set()
    rng = np.random.RandomState(int(options.get("seed", 0)))
    return {str(s) for s in rng.choice(np.array(names), size=k, replace=False)}


# the `val_from_train` rules a catalog layout may name
VAL_RULES = {"shuffle_split": shuffle_split, "choice": choice}


def draw_val(names: list[str], spec: dict | None, where: str) -> set[str]:
    """The train names that become val under a layout's `val_from_train` spec (none without one)."""
    if not spec:
        return set()
    rule = spec.get("rule")
    if rule not in VAL_RULES:
        raise ConvertError(
            f"{where}: val_from_train rule {rule!r} is not one of {sorted(VAL_RULES)}"
        )
    return VAL_RULES[rule](names, spec)
