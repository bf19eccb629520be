"""Compute at the machine's limit: precision chosen from the device, threads fixed by the run (never
by the load), and many decoders trained in one pass over the features with the results they get
alone."""

from __future__ import annotations

import copy
import time

import numpy as np
import pytest
import torch

from cryocube.engine.evaluate import evaluate
from cryocube.engine.plan import plan_runs
from cryocube.errors import UserError
from cryocube.families import PlanContext, RunSpec
from cryocube.families.recipes import load_recipe
from cryocube.precision import DeviceInfo, autocast, fast_bf16, resolve, this_device

FAST = [
    "epochs=3",
    "decoder_channels=16",
    "input_size=32",
    "val_every=1",
    "crops_per_sample=2",
    "batch_size=4",
    "normalization=cube",
    "threads=1",
]
A100 = DeviceInfo("cuda", "A100", (8, 0))
T4 = DeviceInfo("cuda", "T4", (7, 5))
SAPPHIRE = DeviceInfo("cpu", "xeon", cpu_bf16=True)
AVX2 = DeviceInfo("cpu", "epyc", cpu_bf16=False)


@pytest.fixture(scope="module")
def cube(tile_cube):
    return tile_cube("glid", train=8, val=2, test=2, seed=13)


def test_auto_precision_follows_the_device_capability():
    assert [resolve("auto", d) for d in (A100, T4, SAPPHIRE, AVX2)] == [
        "bf16",
        "fp32",
        "bf16",
        "fp32",
    ]
    assert [fast_bf16(d) for d in (A100, T4, SAPPHIRE, AVX2)] == [True, False, True, False]
    # asked for: honoured
    assert resolve("fp32", A100) == "fp32" and resolve("bf16", AVX2) == "bf16"
    with pytest.raises(UserError, match="fp16 needs a GPU"):
        resolve("fp16", AVX2)
    me = this_device()  # this machine, as torch reports it
    assert me.type in ("cpu", "cuda") and resolve("auto", me) in ("bf16", "fp32")
    with autocast("cpu", "bf16"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with autocast("cpu", "fp32"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


def test_precision_is_recorded_and_changes_the_run_id(cube, tmp_path):
    ids, idents = {}, {}
    for dev in (A100, AVX2):
        for req in ("auto", "fp32"):
            p = plan_runs(
                [RunSpec("ssl4eo_moco", cube)],
                load_recipe(None, FAST + [f"precision={req}"]),
                PlanContext(out=str(tmp_path), allow_random_weights=True, device=dev),
            )[0]
            ids[(dev.name, req)] = p.run_id
            idents[(dev.name, req)] = p.identity
            assert p.record.precision["requested"] == req
            assert p.record.precision["effective"] == (
                "bf16" if (dev is A100 and req == "auto") else "fp32"
            )
            assert p.identity["precision"] == p.record.precision["effective"]
    # requested and effective are hashed
    assert ids[("A100", "auto")] != ids[("A100", "fp32")] != ids[("epyc", "auto")]
    # fp32 asked for is the same arithmetic on any device, but on a CPU the torch threads order the
    # reductions
    cpu, gpu = idents[("epyc", "fp32")], idents[("A100", "fp32")]
    assert (
        cpu["threads"] == 1
        and "threads" not in gpu
        and {k: v for k, v in cpu.items() if k != "threads"} == gpu
    )
    # the memory format follows the device too (channels_last measured faster on CUDA, slower on
    # AVX2 CPUs)
    p = plan_runs(
        [RunSpec("unet", cube)],
        load_recipe(None, FAST),
        PlanContext(out=str(tmp_path), device=A100),
    )[0]
    assert (
        p.work.memory_format == "channels_last"
        and p.record.fields["memory_format"] == "channels_last"
    )
    # bf16 on AMX: channels_last measured faster too
    amx = DeviceInfo("cpu", "xeon", cpu_bf16=True, cpu_amx=True)
    p = plan_runs(
        [RunSpec("unet", cube)], load_recipe(None, FAST), PlanContext(out=str(tmp_path), device=amx)
    )[0]
    assert p.work.memory_format == "channels_last" and p.record.precision["effective"] == "bf16"
    p = plan_runs(
        [RunSpec("unet", cube)],
        load_recipe(None, FAST + ["precision=fp32"]),
        PlanContext(out=str(tmp_path), device=amx),
    )[0]
    assert p.work.memory_format == "contiguous"


def test_bf16_and_fp32_runs_learn_alike(cube, tmp_path, client):
    """On learnable data the bf16 run lands within 10 mIoU points of the fp32 run (here bf16 is
    emulated on CPU)."""
    res = {}
    for prec in ("fp32", "bf16"):
        cfg = load_recipe(None, FAST + ["epochs=6", f"precision={prec}"])
        (r,) = evaluate(
            [RunSpec("unet", cube)], str(tmp_path / prec), cfg, client=client, progress=False
        ).records
        assert r["status"] == "ok", r.get("error")
        assert r["precision"]["effective"] == prec
        res[prec] = r["metrics"]["mIoU"]
    assert res["fp32"] > 60 and abs(res["fp32"] - res["bf16"]) < 10, res


def _threads_in_task(threads) -> tuple[int, int]:
    """torch's threads at the start of a task and after a second's work, beside whatever else
    runs."""
    from cryocube.cluster.runtime import torch_task

    with torch_task(threads) as (_, n):
        first = torch.get_num_threads()
        a = torch.randn(256, 256)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 1:
            a = torch.tanh(a @ a)
        assert n == first
        return first, torch.get_num_threads()


def test_threads_are_fixed_by_the_run_not_by_the_load(client):
    """A task's threads are its run's (or the worker's configured ones), the same alone and two at
    once."""
    from cryocube.cluster.client import cluster_threads

    configured = cluster_threads(client)
    assert configured == 1  # the fixture's workers: Dask's nanny starts them with OMP_NUM_THREADS=1
    alone = client.submit(_threads_in_task, None, pure=False).result()
    together = client.gather(
        client.map(_threads_in_task, [None, None], pure=False, key=["t-a", "t-b"])
    )
    assert alone == together[0] == together[1] == (configured, configured)
    two = client.gather(client.map(_threads_in_task, [2, 2], pure=False, key=["t-c", "t-d"]))
    assert two == [(2, 2), (2, 2)]


def test_decoders_trained_together_equal_decoders_trained_alone(cube, tmp_path, client):
    runs = [RunSpec("ssl4eo_moco", cube, "frozen", seed=s) for s in range(3)] + [
        RunSpec("ssl4eo_moco", cube, "fewshot", fraction=0.5)
    ]
    together = evaluate(
        runs,
        str(tmp_path / "together"),
        load_recipe(None, FAST + ["decoders_per_task=8"]),
        client=client,
        progress=False,
        allow_random_weights=True,
    )
    alone = evaluate(
        runs,
        str(tmp_path / "alone"),
        load_recipe(None, FAST + ["decoders_per_task=1"]),
        client=client,
        progress=False,
        allow_random_weights=True,
    )
    t = {r["run_id"]: r for r in together.records}
    a = {r["run_id"]: r for r in alone.records}
    assert set(t) == set(a) and len(t) == 4  # decoders_per_task does not change what a run is
    assert max(r["decoders_in_task"] for r in t.values()) >= 2 and {
        r["decoders_in_task"] for r in a.values()
    } == {1}
    for k in t:
        assert t[k]["confusion_matrix"] == a[k]["confusion_matrix"], t[k]["model"]
        assert [c["mIoU"] for c in t[k]["val_curve"]] == [c["mIoU"] for c in a[k]["val_curve"]]
    assert len({r["metrics"]["mIoU"] for r in t.values()}) > 1  # different seeds really differ
    # the cache was computed once and read by every decoder of the group
    assert (
        len(together.prepared) == 1 and len({r["encoder_forward_items"] for r in t.values()}) == 1
    )
    assert np.all([r["threads"]["fit"] == [1] for r in t.values()])
    assert {r["optimizer"] for r in t.values()} == {"adamw-fused"}  # the record names it


def test_auto_memory_format_is_channels_last_only_where_it_measured_faster():
    from cryocube.precision import auto_memory_format

    amx = DeviceInfo("cpu", "xeon", cpu_bf16=True, cpu_amx=True)
    assert auto_memory_format(amx, "bf16") == "channels_last"
    assert auto_memory_format(amx, "fp32") == "contiguous"  # not measured faster in fp32
    # AVX512-BF16, no AMX
    assert auto_memory_format(DeviceInfo("cpu", "epyc", cpu_bf16=True), "bf16") == "contiguous"
    assert auto_memory_format(AVX2, "fp32") == "contiguous"
    assert auto_memory_format(A100, "bf16") == "channels_last"


def test_channels_last_leaves_a_3d_convolution_as_it_is():
    """SpectralGPT embeds patches with a 3-D convolution: `Module.to(memory_format=channels_last)`
    refuses its 5-D weight, so its fine-tune failed on AMX (where `auto` picks channels_last). The
    conversion takes the 4-D weights only, and the encoder computes what it did."""
    from cryocube.families.segmentation.train import channels_last
    from cryocube.models import build_encoder

    torch.manual_seed(0)
    enc = build_encoder("spectralgpt", input_size=32).eval()
    with pytest.raises(RuntimeError, match="rank 4"):
        copy.deepcopy(enc).to(memory_format=torch.channels_last)
    x = torch.randn(2, 12, 32, 32)
    with torch.no_grad():
        want = [f.clone() for f in enc(x)]
        five = [t for t in enc.parameters() if t.dim() == 5]
        assert five and channels_last(enc) is enc
        assert all(t.is_contiguous() for t in five)
        four = [t for t in enc.parameters() if t.dim() == 4]
        assert all(t.is_contiguous(memory_format=torch.channels_last) for t in four)
        got = enc(x)
    for a, b in zip(want, got):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # a decoder's 2-D convolutions do turn channels_last
    from cryocube.decoders.upernet import UPerNet

    dec = channels_last(UPerNet([32] * 4, 2, pyramid=True, channels=16))
    four = [t for t in dec.parameters() if t.dim() == 4]
    assert four and all(t.is_contiguous(memory_format=torch.channels_last) for t in four)


def test_fused_adamw_steps_as_the_per_tensor_adamw():
    from cryocube.decoders.upernet import UPerNet
    from cryocube.families.segmentation.train import adamw

    cfg = load_recipe(None, FAST)
    torch.manual_seed(0)
    ref = list(UPerNet([32] * 4, 2, pyramid=True, channels=16).parameters())
    fused = [p.detach().clone().requires_grad_() for p in ref]
    start = [p.detach().clone() for p in ref]
    opt, name = adamw(fused, cfg, "cpu")
    assert name == "adamw-fused" and opt.defaults["fused"]
    per_tensor = torch.optim.AdamW(
        ref, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay
    )
    for _ in range(5):  # the same gradients to both: what differs is the optimiser alone
        for a, b in zip(ref, fused):
            a.grad = torch.randn_like(a)
            b.grad = a.grad.clone()
        per_tensor.step()
        opt.step()
    moved = min(float((b.detach() - p0).abs().max()) for b, p0 in zip(fused, start))
    for a, b in zip(ref, fused):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-7)
    assert moved > 1e-5  # every tensor stepped
    # a device without the kernel gets the per-tensor AdamW, and says so
    assert adamw(ref, cfg, "mps")[1] == "adamw"
