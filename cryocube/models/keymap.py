"""Checkpoint key maps: the published checkpoint layout <-> this package's module names, declared
(the built-in ones in catalogs/keymaps.yaml, whose header explains each step) and invertible, so a
test writes a checkpoint in the reference layout from a model (`to_reference`) and loads it back."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

import torch
from torch import Tensor

from ..catalog import CATALOG_DIR, load_yaml
from ..mapping import from_mapping

StateDict = dict[str, Tensor]
KEYMAP_FILE = CATALOG_DIR / "keymaps.yaml"


def _template_regex(t: str) -> re.Pattern:
    parts = re.split(r"\{([a-z])\}", t)  # literal text and field names, alternating
    return re.compile(
        "".join(f"(?P<{p}>\\d+)" if i % 2 else re.escape(p) for i, p in enumerate(parts))
    )


def _drop_dims(x: Tensor, dims: tuple[int, ...]) -> Tensor:
    """`x` without its singleton `dims`; a tensor without them (another layout) stays as it is."""
    if not dims or x.dim() <= max(dims) or any(x.shape[d] != 1 for d in dims):
        return x
    return x.reshape([s for i, s in enumerate(x.shape) if i not in dims])


def _add_dims(x: Tensor, dims: tuple[int, ...]) -> Tensor:
    for d in sorted(dims):
        x = x.unsqueeze(d)
    return x


@dataclass(frozen=True)
class Reshape:
    """One tensor whose singleton dims differ: `ours` lists those only this package's has,
    `reference` those only the checkpoint's has (CLIP's class_embedding (D,) is our (1, 1, D))."""

    key: str
    ours: tuple[int, ...] = ()
    reference: tuple[int, ...] = ()

    def apply(self, sd: StateDict, load: bool) -> StateDict:
        """`sd` with the tensor reshaped toward our layout (`load`) or the reference's."""
        if self.key not in sd:
            return sd
        drop, add = (self.reference, self.ours) if load else (self.ours, self.reference)
        return {**sd, self.key: _add_dims(_drop_dims(sd[self.key], drop), add)}


@dataclass(frozen=True)
class MergeQkv:
    """Separate q/k/v linears in the reference <-> one fused qkv linear here ({i} = block index)."""

    q: str
    k: str
    v: str
    qkv: str
    suffixes: tuple[str, ...] = ("weight", "bias")

    def _matches(self, sd: StateDict, template: str):
        rx = _template_regex(template)
        for key in list(sd):
            for suf in self.suffixes:
                m = key.endswith("." + suf) and rx.fullmatch(key[: -len(suf) - 1])
                if m:
                    yield key, suf, m.groupdict()

    def apply(self, sd: StateDict, load: bool) -> StateDict:
        """`sd` with q/k/v concatenated into qkv (`load`) or qkv split back into three."""
        sd, parts = dict(sd), (self.q, self.k, self.v)
        for key, suf, g in self._matches(sd, self.q if load else self.qkv):
            names = [f"{t.format(**g)}.{suf}" for t in parts]
            if not load:
                sd.update(zip(names, (p.clone() for p in sd.pop(key).chunk(3, dim=0))))
            elif all(p in sd for p in names):
                sd[f"{self.qkv.format(**g)}.{suf}"] = torch.cat([sd.pop(p) for p in names], dim=0)
        return sd


@dataclass(frozen=True)
class KeyMap:
    name: str
    container: tuple[str, ...] = ()
    prefix: tuple[str, ...] = ()
    require_prefix: bool = False
    include: str | None = None
    checks_zero: str | None = None
    reshape: tuple[Reshape, ...] = ()
    merge_qkv: MergeQkv | None = None
    renames: tuple[tuple[str, str], ...] = ()
    # regexes of our keys that are recomputed at build time, never loaded
    computed: tuple[str, ...] = ()
    notes: str = ""

    @property
    def transforms(self) -> tuple[Reshape | MergeQkv, ...]:
        """The tensor rewrites that are not renames, in load order."""
        return self.reshape + ((self.merge_qkv,) if self.merge_qkv else ())

    def unwrap(self, obj, where: str = "checkpoint") -> Mapping:
        """The state dict under `container`; a missing level is a KeyError naming the top keys."""
        for k in self.container:
            if not isinstance(obj, Mapping) or k not in obj:
                have = sorted(obj.keys())[:20] if isinstance(obj, Mapping) else type(obj).__name__
                raise KeyError(
                    f"{where}: expected a {k!r} entry (key map {self.name!r}); top-level keys:"
                    f" {have}"
                )
            obj = obj[k]
        if not isinstance(obj, Mapping):
            raise KeyError(
                f"{where}: the state dict is a {type(obj).__name__}, not a mapping of tensors"
            )
        return obj

    def to_model(self, checkpoint, where: str = "checkpoint") -> tuple[StateDict, list[str]]:
        """(state dict in our names, checkpoint keys set aside as not part of the encoder)."""
        sd = self.unwrap(checkpoint, where)
        out: StateDict = {}
        aside: list[str] = []
        node = checkpoint
        for c in self.container:  # sibling entries of the file (other sub-models, optimizer, args)
            aside += [f"{k} (not read)" for k in node if k != c]
            node = node[c]
        for key, v in sd.items():
            k = next((key[len(p) :] for p in self.prefix if key.startswith(p)), None)
            if k is None and self.require_prefix:
                aside.append(key)
                continue
            k = key if k is None else k
            if self.include is not None and not re.fullmatch(self.include, k):
                aside.append(key)
                continue
            if self.checks_zero is not None and re.fullmatch(self.checks_zero, k):
                if torch.is_tensor(v) and torch.count_nonzero(v) > 0:
                    raise ValueError(
                        f"{where}: {key} should hold zeros (a bias-free layer) but does not"
                    )
                continue
            if not torch.is_tensor(v):
                aside.append(key)
                continue
            out[k] = v
        for t in self.transforms:
            out = t.apply(out, load=True)
        return {self._rename(k, True): v for k, v in out.items()}, aside

    def to_reference(self, state: StateDict) -> dict:
        """A checkpoint in the reference layout holding `state` (our names)."""
        sd = {k: v for k, v in state.items() if not any(re.fullmatch(c, k) for c in self.computed)}
        ref: StateDict = {self._rename(k, False): v for k, v in sd.items()}
        for t in reversed(self.transforms):
            ref = t.apply(ref, load=False)
        if self.prefix:
            ref = {self.prefix[0] + k: v for k, v in ref.items()}
        obj: dict = ref
        for k in reversed(self.container):
            obj = {k: obj}
        return obj

    def _rename(self, key: str, forward: bool) -> str:
        """`key` through the first matching (reference, ours) template, `{i}` carried over."""
        for pair in self.renames:
            src, dst = pair if forward else pair[::-1]
            m = _template_regex(src).match(key)
            if m is not None:
                return dst.format(**m.groupdict()) + key[m.end() :]
        return key


def catalog_keymaps(path=KEYMAP_FILE) -> list[KeyMap]:
    """The key maps of catalogs/keymaps.yaml (name -> fields), each read by mapping.from_mapping."""
    where = str(path)
    return [
        from_mapping(KeyMap, {"name": name, **(d or {})}, f"{where}: {name}")
        for name, d in load_yaml("keymaps", where).items()
    ]
