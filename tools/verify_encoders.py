#!/usr/bin/env python
"""Equivalence of every cryocube encoder with the Cryo-Bench reference's own encoder, level by
level.

For each model config: build cryocube's encoder with a fixed seed, perturb every tensor of its state
dict (so zero biases and unit norms cannot hide a mis-mapped key), write it as a checkpoint in the
published layout (the key map's `to_reference`), then
  * cryocube side (this venv): `build_encoder(id, weights=CKPT)` -> `weights.load_weights` ->
    features;
  * reference side (the peer venv, /work/peervenv): the reference's own encoder class from its own
    Hydra config (driven through ../shared/peer/peer.py), its own loader on the same file ->
    features;
and compare every feature level (shape, max abs and max relative difference, fp32, one seeded
input). The reference's features are stored in small form (seeded sample of values + per-channel
means) under tests/data/equivalence/ with the reference commit, so tests/test_equivalence.py checks
cryocube against them without the reference.

  python tools/verify_encoders.py [MODEL ...] [--out tests/data/equivalence]      (cryocube venv)

Never imported by the package; tests import `make_case` and `summarise` from it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PEER = Path(os.environ.get("PEER_DIR", ROOT.parent / "shared" / "peer"))
PEER_PYTHON = os.environ.get("PEER_PYTHON", "/work/peervenv/bin/python")
DATA = ROOT / "tests" / "data" / "equivalence"
SEED = 27
NOISE = 0.02
N_SAMPLES = 2048
#: the reference's dataset config that supplies ${dataset.bands} to dataset-band encoders, and
# cryocube's twin
DATASET = ("glnet_dataset", "gld")
#: input side for encoders that take the dataset tile size (smallest the model takes comfortably)
TILE = {"unet": 64, "ramen": 64}

#: per config: the reference encoder config and Hydra overrides (a config the reference composes at
# run time)
REFERENCE = {
    "terramind_large_sar": (
        "terramind_large",
        [
            "encoder.modalities=[S1GRD]",
            "~encoder.input_bands",
            "+encoder.input_bands={sar:[VV,VH]}",
        ],
    ),
}


def _unprefixed(ckpt: Path) -> Path:
    """RAMEN: the reference's loader strips 'model.encoder.'/'encoder.' from its OWN parameter names
    (which have none) and looks them up in the file, whose keys carry the prefixes; a copy without
    them is what it can read.
    """
    import torch

    obj = torch.load(ckpt, map_location="cpu")
    sd = {
        k.split("encoder.", 1)[1] if k.startswith(("model.encoder.", "encoder.")) else k: v
        for k, v in obj["state_dict"].items()
    }
    out = ckpt.with_name(ckpt.stem + "_unprefixed.pth")
    torch.save({**obj, "state_dict": sd}, out)
    return out


#: configs whose reference loader needs another layout than the published one, and the rewrite
REFERENCE_LAYOUT = {"ramen": _unprefixed}
#: the modalities a reference encoder reads where its config lists more (VIT_Encoder reads only
# "optical")
MODALITIES = {"vit_scratch": ["optical"]}
#: deviation switches under which a config reproduces the reference (see docs/deviations.md)
SWITCHES: dict[str, dict] = {"ssl4eo_dino": {"follow_reference": True}}


# ------------------------------------------------------------------------------------------------
# cryocube side (also used by tests/test_equivalence.py)
# ------------------------------------------------------------------------------------------------
def _bands(spec):
    if not spec.takes_dataset_bands:
        return None
    from cryocube.catalog import load_dataset

    return load_dataset(DATASET[1]).bands


def build(model_id: str, weights=None, **overrides):
    """cryocube's encoder for `model_id` as verified: published size, the dataset's bands where it
    takes them."""
    import torch

    from cryocube.models import build_encoder, model_spec

    spec = model_spec(model_id)
    torch.manual_seed(SEED)
    enc = build_encoder(
        model_id, bands=_bands(spec), input_size=TILE.get(model_id), weights=weights, **overrides
    )
    return enc.eval()


def perturbed_state(enc, km) -> dict:
    """The encoder's state dict plus seeded noise on every float tensor the checkpoint holds
    (variances kept positive; tensors the key map recomputes at build time are left as built)."""
    import re

    import torch

    g = torch.Generator().manual_seed(SEED)
    out = {}
    for k, v in sorted(enc.state_dict().items()):
        if v.is_floating_point() and not any(re.fullmatch(c, k) for c in km.computed):
            n = torch.randn(v.shape, generator=g) * NOISE
            v = v * (1 + n.abs()) if k.endswith("running_var") else v + n
        out[k] = v.clone()
    return {k: out[k] for k in enc.state_dict()}  # module order (noise drawn in sorted order)


def _slot_aliases(model_id: str) -> list[str]:
    """The Cryo-Bench band name of every input channel of cryocube's encoder, in order."""
    from cryocube.models import match_bands, model_spec

    spec = model_spec(model_id)
    if not spec.takes_dataset_bands:
        return list(spec.slots)
    m = match_bands(spec, _bands(spec), "named")
    return [m.slot_band(k).alias for k in range(len(m.slots))]


def reference_bands(ref_cfg: str, overrides: list) -> list[str]:
    """The reference encoder's input bands (optical, then SAR), from its composed Hydra config (peer
    venv)."""
    code = (
        "import json, sys, argparse, tempfile; sys.path.insert(0, %r); import peer; ns ="
        " argparse.Namespace(mirror=peer.DEFAULT_MIRROR, cache=peer.DEFAULT_CACHE, ref_dir=None,"
        " threads=None); root, _ = peer.setup_reference(ns); cfg = peer.compose_cfg(root, %r,"
        " tempfile.gettempdir(), %r, peer.default_decoder(%r), %r); b = cfg.encoder.input_bands; m"
        " = %r or list(b); print(json.dumps([x for k in ('optical', 'sar') if k in m for x in"
        " b.get(k, [])]))"
        % (str(PEER), DATASET[0], ref_cfg, ref_cfg, list(overrides), MODALITIES.get(ref_cfg))
    )
    p = subprocess.run(
        [PEER_PYTHON, "-c", code], capture_output=True, text=True, env=_peer_env(), check=True
    )
    return json.loads(p.stdout.strip().splitlines()[-1])


def _peer_env() -> dict:
    return {
        **os.environ,
        "PEER_REF_MIRROR": os.environ.get(
            "PEER_REF_MIRROR", "/work/.mirror/Sk-2103+Cryo-Bench/repo"
        ),
        "PEER_REF_CACHE": os.environ.get("PEER_REF_CACHE", "/work/peercache"),
        "PYTHONPATH": "",
    }


def _missing_reference() -> str | None:
    """One sentence on how to get the reference venv and snapshot when either is missing."""
    env = _peer_env()
    if not Path(PEER_PYTHON).exists():
        return (
            f"no reference venv at {PEER_PYTHON}: run `PEER_VENV=... bash {PEER}/setup.sh`, then"
            " `$PEER_VENV/bin/pip install albumentations` (TerraMind's module imports it), and set"
            " PEER_PYTHON"
        )
    if not Path(env["PEER_REF_MIRROR"]).exists() and not os.environ.get("PEER_REF_DIR"):
        return (
            f"no Cryo-Bench snapshot at {env['PEER_REF_MIRROR']}: fetch github Sk-2103/Cryo-Bench "
            "(the search tool's fetch) and set PEER_REF_MIRROR to its git directory"
        )
    return None


def make_input(enc):
    """The one seeded input (SEED + 1) both sides see; tests rebuild it to check against the stored
    reference features."""
    import torch

    g = torch.Generator().manual_seed(SEED + 1)
    return torch.randn(1, enc.in_chans, enc.input_size, enc.input_size, generator=g)


def make_case(model_id: str, workdir: Path, **switch):
    """(checkpoint path in the published layout, input, cryocube's features loaded from that file,
    state dict).

    The checkpoint holds what the default (deviating) build loads; `switch` (e.g.
    follow_reference=True) changes only how it is built and loaded. Built once where the switch
    keeps the architecture."""
    import torch

    from cryocube.models.registry import get_keymap
    from cryocube.models.weights import load_weights

    enc = build(model_id)
    km = get_keymap(enc.spec.weights.key_map if enc.spec.weights else "native")
    sd = perturbed_state(enc, km)
    ckpt = Path(workdir) / f"{model_id}.pth"
    torch.save(km.to_reference(sd) if enc.spec.pretrained else sd, ckpt)
    x = make_input(enc)
    loaded = build(model_id, **switch) if switch else enc
    if enc.spec.pretrained:
        load_weights(loaded, ckpt)
    else:  # trained from scratch: no published layout; the reference's module names equal ours
        loaded.load_state_dict(sd, strict=True)
    with torch.no_grad():
        feats = [f.float() for f in loaded(x)]
    return ckpt, x, feats, sd


def summarise(feats) -> dict:
    """Small stand-in of feature maps: per level a seeded sample of values and the per-channel
    means."""
    out = {}
    for i, f in enumerate(feats):
        a = np.asarray(f, dtype=np.float32)
        idx = np.random.default_rng(SEED + i).choice(
            a.size, size=min(N_SAMPLES, a.size), replace=False
        )
        idx.sort()
        out[f"l{i}_shape"] = np.array(a.shape, dtype=np.int64)
        out[f"l{i}_index"] = idx.astype(np.int64)
        out[f"l{i}_values"] = a.reshape(-1)[idx]
        out[f"l{i}_chanmean"] = (
            a.reshape(a.shape[0], a.shape[1], -1).mean(-1).reshape(-1).astype(np.float32)
        )
    return out


def compare(ours, theirs) -> list[dict]:
    """Per level: shape, max abs and max relative difference (against the reference's largest
    value); a shape or count mismatch is a row, not an error."""
    rows = []
    for i, (a, b) in enumerate(zip(ours, theirs)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.shape != b.shape:
            rows.append(
                {
                    "level": i,
                    "ours": list(a.shape),
                    "reference": list(b.shape),
                    "max_abs": None,
                    "max_rel": None,
                }
            )
            continue
        d = np.abs(a - b)
        rows.append(
            {
                "level": i,
                "shape": list(a.shape),
                "max_abs": float(d.max()),
                "max_rel": float(d.max() / max(np.abs(b).max(), 1e-12)),
            }
        )
    if len(ours) != len(theirs):
        rows.append({"level": "count", "ours": len(ours), "reference": len(theirs)})
    return rows


# ------------------------------------------------------------------------------------------------
# reference side (runs in the peer venv; imports no cryocube)
# ------------------------------------------------------------------------------------------------
def reference_features(job: dict) -> dict:
    """Runs in the peer venv (`--reference-side`): the reference's own encoder and loader on the
    checkpoint; features to job["out"], notes returned."""
    sys.path.insert(0, str(PEER))
    import logging

    import peer  # the shared harness: extraction, sys.path, single-process shims, Hydra composition
    import torch
    from hydra.utils import instantiate

    ns = argparse.Namespace(
        mirror=peer.DEFAULT_MIRROR, cache=peer.DEFAULT_CACHE, ref_dir=None, threads=None
    )
    ref_root, commit = peer.setup_reference(ns)
    enc_cfg, extra = job["reference_config"], list(job.get("overrides", []))
    ckpt = job["checkpoint"]
    extra += [f"encoder.encoder_weights='{ckpt}'"] if job["pretrained"] else []
    if job.get("input_size"):
        extra.append(f"encoder.input_size={job['input_size']}")
    cfg = peer.compose_cfg(
        ref_root, DATASET[0], tempfile.gettempdir(), enc_cfg, peer.default_decoder(enc_cfg), extra
    )
    torch.manual_seed(SEED)
    notes = []
    import requests

    real_get = requests.get

    # SatlasNet's loader fetches weights_url with requests.get: serve the file in hand instead
    class _Local:
        status_code = 200

        def __init__(self, url):
            notes.append(f"requests.get({url}) served from {ckpt}")
            self.content = Path(ckpt).read_bytes()

    requests.get = lambda url, *a, **k: _Local(url)
    # what the reference's loaders log (TerraMind's constructor reports missing keys this way)
    logged = []

    class _Keep(logging.Handler):
        def emit(self, record):
            logged.append(record.getMessage()[:500])

    keep = _Keep(logging.WARNING)
    logging.getLogger().addHandler(keep)
    try:
        encoder = instantiate(cfg.encoder)
        warned = []
        real_warn = encoder.parameters_warning

        def record(missing, incompatible, logger):
            warned.append(
                {"missing": sorted(missing), "incompatible": sorted(map(str, incompatible))}
            )
            return real_warn(missing, incompatible, logger)

        encoder.parameters_warning = record
        if job["pretrained"]:
            encoder.load_encoder_weights(logging.getLogger("reference"))
        # trained from scratch: the same architecture must hold the same tensors in the same module
        # order
        else:
            ours = list(torch.load(ckpt, map_location="cpu").items())
            theirs = list(encoder.state_dict().items())
            a, b = [tuple(v.shape) for _, v in ours], [tuple(v.shape) for _, v in theirs]
            if a != b:
                raise SystemExit(
                    f"architectures differ: cryocube {len(a)} tensors"
                    f" {[(k, tuple(v.shape)) for k, v in ours]}; reference {len(b)} tensors"
                    f" {[(k, tuple(v.shape)) for k, v in theirs]}"
                )
            res = encoder.load_state_dict(
                {rk: v for (rk, _), (_, v) in zip(theirs, ours)}, strict=True
            )
            notes.append(
                f"{len(ours)} tensors matched by module order and shape;"
                f" load_state_dict(strict=True): {res}"
            )
    finally:
        requests.get = real_get
        logging.getLogger().removeHandler(keep)
    encoder.eval()
    x = torch.from_numpy(np.load(job["input"]))
    bands = {m: list(b) for m, b in cfg.encoder.input_bands.items()}
    n_opt = len(bands.get("optical", []))
    bands = {m: b for m, b in bands.items() if m in job.get("modalities", bands)}
    image = {}
    if "optical" in bands:
        image["optical"] = x[:, :n_opt].unsqueeze(2)
    if "sar" in bands:
        image["sar"] = x[:, n_opt : n_opt + len(bands["sar"])].unsqueeze(2)
    if (
        not getattr(encoder, "multi_temporal", False)
        and peer.default_decoder(enc_cfg) == "seg_upernet"
    ):
        # what SegUPerNet feeds a single-time encoder
        image = {k: v[:, :, 0] for k, v in image.items()}
    with torch.no_grad():
        feats = encoder(image)
    np.savez(job["out"], *[f.float().numpy() for f in feats])
    return {
        "commit": commit,
        "class": type(encoder).__name__,
        "bands": bands,
        "warnings": warned,
        "notes": notes,
        "log": logged,
    }


# ------------------------------------------------------------------------------------------------
def verify(model_id: str, workdir: Path, out: Path | None, switch: dict | None = None) -> dict:
    """One model end to end: our features, the reference's from a subprocess on inputs in its band
    order; a failure is an `error` entry, not raised."""
    import torch

    from cryocube.models import model_spec

    spec = model_spec(model_id)
    switch = dict(SWITCHES.get(model_id, {}) if switch is None else switch)
    t0 = time.perf_counter()
    ckpt, x, ours, sd = make_case(model_id, workdir, **switch)
    t_ours = time.perf_counter() - t0
    ref_cfg, overrides = REFERENCE.get(model_id, (spec.reference_config, []))
    ref_bands = reference_bands(ref_cfg, overrides)
    slots = _slot_aliases(model_id)
    if sorted(slots) != sorted(ref_bands):
        return {
            "model": model_id,
            "error": f"bands differ: cryocube {slots}, reference {ref_bands}",
        }
    # the reference's channel i is cryocube's channel order[i]
    order = [slots.index(b) for b in ref_bands]
    np.save(workdir / f"{model_id}_x.npy", x.numpy()[:, order])
    # same weights for the reference's band order
    if not spec.pretrained and order != sorted(order):
        first = next(k for k, v in sd.items() if v.ndim == 4 and v.shape[1] == len(order))
        torch.save({**sd, first: sd[first][:, order].clone()}, ckpt)
    job = {
        "reference_config": ref_cfg,
        "overrides": overrides,
        "checkpoint": str(ckpt),
        "pretrained": spec.pretrained,
        "input": str(workdir / f"{model_id}_x.npy"),
        "out": str(workdir / f"{model_id}_ref.npz"),
        "input_size": TILE.get(model_id),
        **({"modalities": MODALITIES[ref_cfg]} if ref_cfg in MODALITIES else {}),
    }
    env = _peer_env()
    t0 = time.perf_counter()
    published = None
    # the reference's loader cannot read the published layout: say what it loads
    if model_id in REFERENCE_LAYOUT:
        p = subprocess.run(
            [PEER_PYTHON, __file__, "--reference-side", json.dumps(job)],
            capture_output=True,
            text=True,
            env=env,
        )
        if p.returncode != 0:
            return {"model": model_id, "error": p.stderr[-3000:]}
        w = json.loads(p.stdout.strip().splitlines()[-1])["warnings"]
        published = {
            "missing": sum(len(x["missing"]) for x in w),
            "incompatible": sum(len(x["incompatible"]) for x in w),
            "of": int(
                sum(v.numel() > 0 for k, v in sd.items() if not k.endswith("num_batches_tracked"))
            ),
        }
        job["checkpoint"] = str(REFERENCE_LAYOUT[model_id](ckpt))
    p = subprocess.run(
        [PEER_PYTHON, __file__, "--reference-side", json.dumps(job)],
        capture_output=True,
        text=True,
        env=env,
    )
    t_ref = time.perf_counter() - t0
    if p.returncode != 0:
        return {"model": model_id, "error": p.stderr[-3000:]}
    meta = json.loads(p.stdout.strip().splitlines()[-1])
    if published is not None:
        meta["published_layout_in_reference"] = published
        meta["notes"].append(
            f"the reference read {job['checkpoint']} (the published file's state_dict without the"
            " 'model.encoder.'/'encoder.' prefixes): from the published layout its loader loads no"
            " encoder tensor"
        )
    with np.load(job["out"]) as z:
        theirs = [z[f"arr_{i}"] for i in range(len(z.files))]
    rows = compare([f.numpy() for f in ours], theirs)
    meta["same_band_order"] = order == sorted(order)
    meta["band_order"] = {"cryocube": slots, "reference": ref_bands}
    res = {
        "model": model_id,
        "reference_config": ref_cfg,
        "overrides": overrides,
        "switch": switch,
        **meta,
        "input_shape": list(x.shape),
        "levels": rows,
        "seconds": {"cryocube": t_ours, "reference": t_ref},
    }
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(out / f"{model_id}.npz", **summarise(theirs))
    return res


def main(argv=None):
    """The CLI: every model (or those named), a line each; with --out, the reference summaries and
    manifest.json that tests/test_equivalence.py reads."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("models", nargs="*")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="store the reference's features here (tests/data/equivalence)",
    )
    ap.add_argument("--report", type=Path, default=None, help="write the comparison as JSON")
    ap.add_argument("--reference-side", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.reference_side:
        import contextlib

        with contextlib.redirect_stdout(sys.stderr):
            meta = reference_features(json.loads(args.reference_side))
        print(json.dumps(meta, default=str))
        return 0
    missing = _missing_reference()
    if missing:
        print(missing, file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    from cryocube.models import list_models

    models = args.models or list_models()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for m in models:
            try:
                r = verify(m, Path(tmp), args.out)
            except Exception as e:  # noqa: BLE001 - one config's failure must not lose the others' results
                r = {"model": m, "error": f"{type(e).__name__}: {e}"}
            results.append(r)
            if "error" in r:
                print(f"{m}: reference side failed:\n{r['error']}", flush=True)
                continue
            worst = max(
                float("inf") if lv.get("max_abs") is None else lv["max_abs"] for lv in r["levels"]
            )
            rel = max(
                float("inf") if lv.get("max_rel") is None else lv["max_rel"] for lv in r["levels"]
            )
            print(
                f"{m}: {len(r['levels'])} levels, max abs {worst:.3g}, max rel {rel:.3g},"
                f" {r['seconds']['cryocube']:.1f}s/{r['seconds']['reference']:.1f}s bands"
                + (
                    " in the same order"
                    if r["same_band_order"]
                    else " permuted to the reference order"
                )
                + f" {json.dumps(r['warnings'])[:300]} {r['notes']}",
                flush=True,
            )
    if args.report:
        args.report.write_text(json.dumps(results, indent=1, default=str))
    if args.out is not None:
        ok = [r for r in results if "error" not in r]
        man = args.out / "manifest.json"
        old = json.loads(man.read_text()) if man.exists() else {}
        for r in ok:
            old[r["model"]] = {
                k: r[k]
                for k in (
                    "reference_config",
                    "overrides",
                    "switch",
                    "commit",
                    "class",
                    "input_shape",
                    "same_band_order",
                    "band_order",
                    "levels",
                    "warnings",
                    "notes",
                    "log",
                    "published_layout_in_reference",
                )
                if k in r
            }
        man.write_text(
            json.dumps(dict(sorted(old.items())), indent=1, default=str).replace(tmp, "<tmp>")
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
