"""`transformers`: any image-text-to-text model of Hugging Face transformers from a local folder or
an fsspec URL (copied once per worker host into a cache keyed by the weights' sha256), generating
greedily in batches, left-padded, in the run's precision."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from .. import store as _store
from ..errors import UserError
from ..precision import DTYPES
from . import register
from .base import Adapter, Generation, ModelRef, Provenance
from .random_vlm import ARCHS, PREFIX, build, loaded_as, state_sha256

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_LOADED: dict[ModelRef, tuple] = {}  # per worker process: one model resident


def _quiet() -> None:
    from transformers.utils import logging as tlog

    tlog.set_verbosity_error()
    tlog.disable_progress_bar()


def local_folder(location: str, sha256: str | None = None) -> Path:
    """A local folder holding the checkpoint. A remote URL is copied: with `sha256` (a worker
    loading the planned weights) into a per-host cache named by it, checked against it; without,
    only its small files (config, processor, tokenizer) into a fresh temporary folder (planning)."""
    if not _store.is_remote(location):
        return Path(_store.local_path(location))
    fs, path = _store.fs_path(location)
    default = Path(tempfile.gettempdir()) / f"cryocube-vlm-{os.getuid()}"
    root = Path(os.environ.get("CRYOCUBE_VLM_CACHE", default))
    root.mkdir(parents=True, exist_ok=True)
    dest = root / sha256[:32] if sha256 else None
    if dest is not None and (dest / ".complete").exists():
        return dest
    tmp = Path(tempfile.mkdtemp(dir=root))
    for f in fs.ls(path, detail=False):
        name = f.rstrip("/").rsplit("/", 1)[-1]
        if sha256 or not name.endswith(WEIGHT_SUFFIXES):
            fs.get(f, str(tmp / name))
    if dest is None:
        return tmp
    got, _ = weights_sha256(str(tmp))
    if got != sha256:
        raise UserError(
            f"{location}: its weights changed since the run was planned (sha256 {got[:12]}, planned"
            f" {sha256[:12]}); plan the run again"
        )
    (tmp / ".complete").write_text(location)
    try:
        tmp.rename(dest)
    except OSError:  # another task on this host got there first
        return dest if (dest / ".complete").exists() else tmp
    return dest


# planning hashes a checkpoint once per process (it plans twice)
_SHA_MEMO: dict[tuple, tuple[str, list[str]]] = {}


def weights_sha256(location: str) -> tuple[str, list[str]]:
    """sha256 over the checkpoint's weight files (name and bytes, in name order), where they lie."""
    fs, path = _store.fs_path(location)
    info = sorted(
        (d["name"], d.get("size"), str(d.get("ETag") or d.get("mtime") or d.get("LastModified")))
        for d in fs.ls(path, detail=True)
        if d["name"].endswith(WEIGHT_SUFFIXES)
    )
    key = (location, tuple(info))
    if key in _SHA_MEMO:
        return _SHA_MEMO[key]
    h = hashlib.sha256()
    for f, _, _ in info:
        h.update(f.rsplit("/", 1)[-1].encode())
        with fs.open(f, "rb") as fh:
            while chunk := fh.read(1 << 24):
                h.update(chunk)
    _SHA_MEMO[key] = (h.hexdigest(), [f.rsplit("/", 1)[-1] for f, _, _ in info])
    return _SHA_MEMO[key]


def _exists(location: str) -> bool:
    try:
        return bool(location) and _store.file_exists(f"{location.rstrip('/')}/config.json")
    except Exception:  # noqa: BLE001 - an unreachable URL is a missing model
        return False


@register
class Transformers(Adapter):
    """Any transformers image-text-to-text model (transformers:<folder or fsspec URL>)."""

    name = "transformers"

    @classmethod
    def random_models(cls) -> list[str]:
        """`transformers:random-<arch>` for each architecture random_vlm builds in code."""
        return [f"{cls.name}:{PREFIX}{a}" for a in ARCHS]

    @classmethod
    def check(cls, location: str, allow_random: bool, precision: str, seed: int):
        """A location holding config.json is checked as a checkpoint; without one, a tiny random
        model is built, but only with `allow_random` (plain `transformers` is random-llava)."""
        _quiet()
        # a folder named random-<arch> holding a checkpoint is that checkpoint
        if not _exists(location):
            return cls._check_random(location, allow_random, precision, seed)
        small = local_folder(location)
        try:
            return cls._check_folder(location, small, precision, seed)
        finally:
            if small != Path(_store.local_path(location)):
                shutil.rmtree(small, ignore_errors=True)

    @classmethod
    def _check_random(cls, location: str, allow_random: bool, precision: str, seed: int):
        """The tiny random model `location` names (plain: llava), with `allow_random` only."""
        arch = location.removeprefix(PREFIX) if location.startswith(PREFIX) else "llava"
        if location.startswith(PREFIX) and arch not in ARCHS:
            raise UserError(
                f"transformers: no random architecture {arch!r} ({location}); known: "
                f"{', '.join(PREFIX + a for a in ARCHS)}"
            )
        if not allow_random:
            what = (
                f"{location} is a random-weights model"
                if location.startswith(PREFIX)
                else f"no checkpoint folder (config.json) at {location}"
                if location
                else "no checkpoint folder given"
            )
            raise UserError(
                f"transformers: {what}; pass transformers:<folder or URL> of an"
                " image-text-to-text model, or --allow-random-weights for a tiny random model"
                " that measures the pipeline"
            )
        model, _ = build(arch, seed)
        sha = state_sha256(model)
        ref = ModelRef(cls.name, "", random=arch, sha256=sha, precision=precision, seed=seed)
        weights = dict(source=None, sha256=sha, pretrained=True, random_init=True)
        return ref, Provenance(
            model_name=f"tiny random {arch}",
            model_class=type(model).__name__,
            weights={**weights, "requested": location or None},
            facts={"parameters": sum(p.numel() for p in model.parameters())},
        )

    @classmethod
    def _check_folder(cls, location: str, small: Path, precision: str, seed: int):
        from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

        try:
            config = AutoConfig.from_pretrained(small)
        except Exception as e:  # noqa: BLE001 - any unreadable config is the user's folder
            raise UserError(
                f"{location}: config.json cannot be read by transformers ({type(e).__name__}: {e})"
            ) from None
        if type(config) not in AutoModelForImageTextToText._model_mapping:
            raise UserError(
                f"{location}: a {config.model_type!r} model is not an image-text-to-text model "
                "(AutoModelForImageTextToText has no class for it)"
            )
        no_pics = (
            f"{location}: the model has no image processor (no preprocessor_config.json or"
            " processor_config.json naming one), so it cannot be given pictures"
        )
        try:
            proc = AutoProcessor.from_pretrained(small)
        except Exception as e:  # noqa: BLE001
            if "image processor" in str(e).lower() or "preprocessor_config" in str(e):
                raise UserError(no_pics) from None
            raise UserError(
                f"{location}: its processor cannot be loaded ({type(e).__name__}:"
                f" {str(e).splitlines()[0]})"
            ) from None
        if getattr(proc, "image_processor", None) is None:
            raise UserError(no_pics)
        sha, files = weights_sha256(location)
        if not files:
            raise UserError(
                f"{location}: no weight files ({', '.join('*' + s for s in WEIGHT_SUFFIXES)}) in"
                " the checkpoint folder"
            )
        ref = ModelRef(cls.name, location, None, sha256=sha, precision=precision, seed=seed)
        name = getattr(config, "_name_or_path", "") or location.rstrip("/").rsplit("/", 1)[-1]
        archs = getattr(config, "architectures", None)
        weights = dict(source=location, sha256=sha, files=files, pretrained=True, random_init=False)
        return ref, Provenance(
            model_name=str(name).rstrip("/").rsplit("/", 1)[-1],
            model_class=archs[0] if archs else config.model_type,
            weights=weights,
        )

    def __init__(self, ref: ModelRef, device: str):
        super().__init__(ref, device)
        import torch

        _quiet()
        got = _LOADED.get(ref)
        if got is None:
            _LOADED.clear()  # one model resident per worker process
            dtype = getattr(torch, DTYPES[ref.precision])
            if ref.random:
                model, proc = build(ref.random, ref.seed)
                if state_sha256(model) != ref.sha256:
                    raise RuntimeError(
                        f"random {ref.random} built on this worker differs from the planned one"
                        " (sha256)"
                    )
                model = loaded_as(model, dtype)
            else:
                from transformers import AutoModelForImageTextToText, AutoProcessor

                folder = local_folder(ref.location, ref.sha256)
                proc = AutoProcessor.from_pretrained(folder)
                model = AutoModelForImageTextToText.from_pretrained(folder, dtype=dtype)
            model.eval().requires_grad_(False).to(device)
            tok = getattr(proc, "tokenizer", None)
            if tok is not None:
                # batched generation continues every row from its last real token
                tok.padding_side = "left"
            got = _LOADED[ref] = (model, proc)
        self.model, self.processor = got

    def prompt_text(self, prompt: str) -> str:
        """The prompt with the picture's place: the chat template, else the image token first."""
        p = self.processor
        if getattr(p, "chat_template", None):
            msgs = [
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}
            ]
            return p.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        token = getattr(p, "image_token", None) or "<image>"
        return f"{token}\n{prompt}"

    def generate(self, images: list, prompts: list[str], max_new_tokens: int) -> list[Generation]:
        """Batched, greedy, left-padded; each answer (and `new_tokens`) ends at its first EOS."""
        import torch
        from PIL import Image

        texts = [self.prompt_text(p) for p in prompts]
        pics = [Image.fromarray(a) for a in images]
        enc = self.processor(images=pics, text=texts, return_tensors="pt", padding=True)
        dtype = next(self.model.parameters()).dtype
        enc = {
            k: v.to(self.device, dtype) if v.is_floating_point() else v.to(self.device)
            for k, v in enc.items()
        }
        tok = getattr(self.processor, "tokenizer", self.processor)
        with torch.inference_mode():
            out = self.model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                num_beams=1,
                pad_token_id=tok.pad_token_id,
            )
        new = out[:, enc["input_ids"].shape[1] :].cpu()
        eos = self.model.generation_config.eos_token_id
        eos = {t for t in ([eos] if isinstance(eos, int) else eos or []) if t is not None}
        eos.add(tok.eos_token_id)
        res = []
        for row in new.tolist():
            # tokens up to and with the first EOS
            n = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
            res.append(Generation(tok.decode(row[:n], skip_special_tokens=True).strip(), n))
        return res
