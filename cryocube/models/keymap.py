"""Checkpoint key maps: the published checkpoint layout <-> this package's module names.

A key map is declarative and invertible, so a test can write a checkpoint in the reference layout
from a model and load it back (`to_reference` then `to_model`). Steps, in load order:

1. `container`: descend into nested dicts of the file (e.g. "model", "state_dict", "s2_encoder").
2. `prefix`: strip the first matching key prefix (e.g. "module.base_encoder."); with
   `require_prefix`, keys without one are not part of the encoder.
3. `include`: a regex on the stripped key; keys that do not match are other parts of the
   pre-training model (decoders, projection heads, text towers) and are set aside, by declaration.
4. `checks`: regexes of keys that must hold zeros and are dropped (bias buffers of bias-free norms).
5. `transforms`: reference <-> ours tensor rewrites that are not renames (q/k/v merge, reshapes).
6. `renames`: ordered (reference, ours) prefix templates with `{i}` standing for an integer.

Anything left must equal the model's state dict exactly: that is checked by weights.load_weights.
Key maps are declared by their architecture modules and registered with `registry.register_keymap`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Mapping

import torch
from torch import Tensor

StateDict = dict[str, Tensor]


def _template_regex(t: str) -> re.Pattern:
    parts = re.split(r"(\{[a-z]\})", t)
    rx = "".join(
        f"(?P<{p[1]}>\\d+)" if re.fullmatch(r"\{[a-z]\}", p) else re.escape(p) for p in parts
    )
    return re.compile(rx)


@dataclass(frozen=True)
class Rename:
    reference: str
    ours: str

    def apply(self, key: str, forward: bool) -> str | None:
        """`key` renamed (`forward`: reference -> ours, else back) with `{i}` carried over; None
        when the template does not match, so the next Rename is tried."""
        src, dst = (self.reference, self.ours) if forward else (self.ours, self.reference)
        m = _template_regex(src).match(key)
        if m is None:
            return None
        return dst.format(**m.groupdict()) + key[m.end() :]


@dataclass(frozen=True)
class Transform:
    """A pair of functions rewriting a whole state dict (reference names on both sides of
    `load`)."""

    name: str
    load: Callable[[StateDict], StateDict]
    save: Callable[[StateDict], StateDict]


@dataclass(frozen=True)
class KeyMap:
    name: str
    container: tuple[str, ...] = ()
    prefix: tuple[str, ...] = ()
    require_prefix: bool = False
    include: str | None = None
    checks_zero: str | None = None
    transforms: tuple[Transform, ...] = ()
    renames: tuple[Rename, ...] = ()
    # regexes of our keys that are recomputed at build time, never loaded
    computed: tuple[str, ...] = ()
    notes: str = ""

    # ---- load direction -------------------------------------------------------------------
    def unwrap(self, obj, where: str = "checkpoint") -> Mapping:
        """The state dict under `container`; a missing level is a KeyError naming the file's
        top-level keys, so a wrong checkpoint is plain."""
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
            k = key
            for p in self.prefix:
                if k.startswith(p):
                    k = k[len(p) :]
                    break
            else:
                if self.require_prefix:
                    aside.append(key)
                    continue
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
            out = t.load(out)
        return {self._rename(k, True): v for k, v in out.items()}, aside

    # ---- save direction (tests, exports) ----------------------------------------------------
    def to_reference(self, state: StateDict) -> dict:
        """A checkpoint in the reference layout holding `state` (our names)."""
        sd = {k: v for k, v in state.items() if not any(re.fullmatch(c, k) for c in self.computed)}
        ref: StateDict = {self._rename(k, False): v for k, v in sd.items()}
        for t in reversed(self.transforms):
            ref = t.save(ref)
        if self.prefix:
            ref = {self.prefix[0] + k: v for k, v in ref.items()}
        obj: dict = ref
        for k in reversed(self.container):
            obj = {k: obj}
        return obj

    def _rename(self, key: str, forward: bool) -> str:
        for r in self.renames:
            new = r.apply(key, forward)
            if new is not None:
                return new
        return key


# A checkpoint written by this package (a fine-tuned encoder): our own names, no rewriting.
NATIVE = KeyMap(name="native")


# ---- reusable transforms -------------------------------------------------------------------------
def reshape_transform(
    key: str, ref_shape: Callable[[tuple], tuple], our_shape: Callable[[tuple], tuple]
) -> Transform:
    """Reshape one tensor (e.g. CLIP's class_embedding (D,) <-> cls_token (1, 1, D))."""

    def to(shape: Callable[[tuple], tuple]) -> Callable[[StateDict], StateDict]:
        def run(sd: StateDict) -> StateDict:
            if key not in sd:
                return sd
            return {**sd, key: sd[key].reshape(shape(tuple(sd[key].shape)))}

        return run

    return Transform(f"reshape {key}", to(our_shape), to(ref_shape))


def merge_qkv_transform(q: str, k: str, v: str, qkv: str, suffixes=("weight", "bias")) -> Transform:
    """Separate q/k/v linears in the reference <-> one fused qkv linear here ({i} = block index)."""

    def matches(sd: StateDict, template: str):
        """(key, suffix, {i: ...}) of every `template`.suffix key of `sd`."""
        rx = _template_regex(template)
        for key in list(sd):
            for suf in suffixes:
                m = key.endswith("." + suf) and rx.fullmatch(key[: -len(suf) - 1])
                if m:
                    yield key, suf, m.groupdict()

    def load(sd: StateDict) -> StateDict:
        sd = dict(sd)
        for _, suf, g in matches(sd, q):
            parts = [f"{t.format(**g)}.{suf}" for t in (q, k, v)]
            if all(p in sd for p in parts):
                sd[f"{qkv.format(**g)}.{suf}"] = torch.cat([sd.pop(p) for p in parts], dim=0)
        return sd

    def save(sd: StateDict) -> StateDict:
        sd = dict(sd)
        for key, suf, g in matches(sd, qkv):
            for t, part in zip((q, k, v), sd.pop(key).chunk(3, dim=0)):
                sd[f"{t.format(**g)}.{suf}"] = part.clone()
        return sd

    return Transform("merge q/k/v", load, save)
