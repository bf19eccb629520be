"""Decoders: UPerNet/linear/U-Net sizes against the reference, shapes, end-to-end training,
decoder-only checkpoints."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cryocube.catalog import Band
from cryocube.decoders import Segmenter, build_decoder
from cryocube.errors import UserError
from cryocube.models import build_encoder
from cryocube.models.base import count_params
from cryocube.models.weights import WeightsError, load_decoder, save_decoder


def bands(n: int) -> list[Band]:
    return [
        Band(name=f"b{i}", alias=a, role="optical")
        for i, a in enumerate(["B4", "B3", "B2", "B8", "B11"][:n])
    ]


# UPerNet parameters (M, 2 classes) measured on the reference, pangaea-models.md 1.5.
@pytest.mark.parametrize(
    "model_id,published,kw",
    [
        ("croma_optical", 46.95, {}),
        ("dofa", 39.35, {"bands": bands(3)}),
        ("gfmswin", 33.71, {}),
        ("prithvi", 21.64, {}),
        ("satlasnet_si", 33.25, {}),
        ("spectralgpt", 164.40, {}),
        ("ssl4eo_moco", 30.89, {}),
        ("terramind_large", 46.95, {}),
    ],
)
def test_upernet_size_matches_reference(model_id, published, kw):
    with torch.device("meta"):
        enc = build_encoder(model_id, **kw)
        dec = build_decoder("upernet", enc, num_classes=2)
    n = count_params(dec)
    assert abs(n / (published * 1e6) - 1) < 0.001, f"{n:,} vs {published} M"


class FakeEncoder(torch.nn.Module):
    """Only the attributes decoders read; features are made directly."""

    def __init__(self, channels, pyramid, architecture="vit"):
        super().__init__()
        self.output_channels, self.pyramid = channels, pyramid
        self.spec = type("S", (), {"architecture": architecture, "id": "fake"})()


def test_upernet_neck_and_output_size():
    dec = build_decoder("upernet", FakeEncoder([32] * 4, False), num_classes=3, channels=16).eval()
    assert dec.neck.rescales == [4, 2, 1, 0.5]
    feats = [torch.randn(2, 32, 14, 14) for _ in range(4)]
    out = dec(feats, (224, 224))
    assert out.shape == (2, 3, 224, 224)
    single = build_decoder("upernet", FakeEncoder([32], False), num_classes=2, channels=16).eval()
    assert single.neck.rescales == [4]  # the fork's one-layer Prithvi: upsampled x4
    assert single([torch.randn(1, 32, 14, 14)], (100, 120)).shape == (1, 2, 100, 120)
    pyr = build_decoder(
        "upernet", FakeEncoder([8, 16, 32, 32], True), num_classes=2, channels=16
    ).eval()
    assert pyr.neck.rescales == [1, 1, 1, 1]
    feats = [torch.randn(1, c, s, s) for c, s in zip([8, 16, 32, 32], [24, 12, 6, 6])]
    assert pyr(feats, (192, 192)).shape == (1, 2, 192, 192)


def test_linear_head_works_on_pyramid_encoders():
    # GFM-Swin widths: the reference head crashes here
    enc = FakeEncoder([256, 512, 1024, 1024], True)
    dec = build_decoder("linear", enc, num_classes=4)
    assert count_params(dec) == 1024 * 4 + 4
    feats = [torch.randn(1, c, s, s) for c, s in zip([256, 512, 1024, 1024], [24, 12, 6, 6])]
    assert dec(feats, (192, 192)).shape == (1, 4, 192, 192)
    vit = build_decoder("linear", FakeEncoder([768] * 4, False), num_classes=2)
    assert count_params(vit) == 1538  # as the reference's seg_linear on a ViT-B


def test_unet_matches_reference_size_and_resolution():
    enc = build_encoder("unet", bands=bands(3), input_size=64)
    dec = build_decoder("unet", enc, num_classes=2)
    assert abs((count_params(enc) + count_params(dec)) / 14.79e6 - 1) < 0.001  # full U-Net, 3 bands
    model = Segmenter(enc, dec)
    x = torch.randn(2, 3, 64, 64)
    assert model(x).shape == (2, 2, 64, 64)
    with pytest.raises(UserError, match="U-Net decoder needs skip maps coarsest first"):
        build_decoder(
            "unet", build_encoder("ssl4eo_mae_sar", depth=1, output_layers=[0]), num_classes=2
        )


def test_segmenter_trains_end_to_end():
    torch.manual_seed(0)
    enc = build_encoder(
        "vit_scratch",
        bands=bands(3),
        embed_dim=32,
        depth=2,
        num_heads=2,
        output_layers=[0, 1],
        input_size=32,
        patch_size=8,
    )
    model = Segmenter(enc, build_decoder("upernet", enc, num_classes=2, channels=16))
    x = torch.randn(4, 3, 32, 32)
    y = (x[:, 0] > 0).long()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(15):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert enc.vit.blocks[0].attn.qkv.weight.grad is not None  # fine-tuning reaches the encoder


def test_decoder_trains_on_cached_frozen_features(tmp_path):
    torch.manual_seed(0)
    enc = build_encoder(
        "ssl4eo_mae_sar", embed_dim=32, depth=2, num_heads=2, output_layers=[0, 1], input_size=64
    ).eval()
    x = torch.randn(4, 2, 64, 64)
    with torch.no_grad():
        feats = enc(x)  # computed once, reused every step
    dec = build_decoder("upernet", enc, num_classes=2, channels=16)
    opt = torch.optim.AdamW(dec.parameters(), lr=1e-3)
    y = (x[:, 0] > 0).long()
    for _ in range(3):
        loss = F.cross_entropy(dec(feats, (64, 64)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert all(p.grad is None for p in enc.parameters())
    path = save_decoder(dec, tmp_path / "decoder.pt", meta={"model": "ssl4eo_mae_sar", "epoch": 3})
    saved = torch.load(path, weights_only=True)["state_dict"]
    assert set(saved) == set(dec.state_dict())  # the frozen encoder is not written again
    dec.eval()
    loaded, meta = load_decoder(path, encoder=enc)
    loaded.eval()
    assert meta == {"model": "ssl4eo_mae_sar", "epoch": 3} and loaded.kind == "upernet"
    assert torch.equal(loaded(feats, (64, 64)), dec(feats, (64, 64)))
    other = build_decoder("upernet", enc, num_classes=3, channels=16)
    with pytest.raises(WeightsError, match="does not fit the decoder"):
        load_decoder(path, decoder=other)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(WeightsError, match="decoder.pt: cannot read"):
        load_decoder(path, encoder=enc)


def test_unknown_decoder_kind():
    with pytest.raises(UserError, match="unknown decoder 'fcn'"):
        build_decoder("fcn", FakeEncoder([8], False), num_classes=2)


def test_deterministic_cuda_forms_equal_torchs_own():
    """The forms UPerNet's pool and the trainer's loss take on CUDA under deterministic algorithms
    (matrix pooling, per-pixel loss summed) compute what torch's own kernels do; run here on CPU
    tensors."""
    import torch.nn.functional as F

    from cryocube.decoders.upernet import AdaptiveAvgPool2d, adaptive_avg_pool_mm
    from cryocube.families.segmentation.train import CrossEntropy, masked_mean_cross_entropy

    g = torch.Generator().manual_seed(0)
    for h, w in ((14, 14), (16, 16), (7, 9), (56, 56)):
        x = torch.randn(2, 3, h, w, generator=g, dtype=torch.float64)
        for s in (1, 2, 3, 6, (2, 5)):
            want = F.adaptive_avg_pool2d(x, s)
            got = adaptive_avg_pool_mm(x, s)
            assert got.shape == want.shape and torch.allclose(got, want, atol=1e-12), (h, w, s)
            # off CUDA: torch's own kernel, bit for bit
            assert torch.equal(AdaptiveAvgPool2d(s)(x), want)
    logits = torch.randn(3, 4, 8, 8, generator=g, dtype=torch.float64)
    target = torch.randint(0, 4, (3, 8, 8), generator=g)
    target[0, :4] = 255
    want = torch.nn.CrossEntropyLoss(ignore_index=255)(logits, target)
    assert torch.allclose(masked_mean_cross_entropy(logits, target, 255), want, atol=1e-12)
    assert torch.equal(CrossEntropy(ignore_index=255)(logits, target), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_resize_is_torchs_bilinear_and_its_gradient_keeps_channels_last(dtype):
    from cryocube.decoders.upernet import resize

    torch.manual_seed(0)
    for layout in (torch.channels_last, torch.contiguous_format):
        x = torch.randn(2, 8, 7, 5, dtype=dtype).contiguous(memory_format=layout)
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya = F.interpolate(a, size=(28, 20), mode="bilinear", align_corners=False)
        yb = resize(b, (28, 20))
        assert torch.equal(ya, yb)  # the values are torch's, bit for bit
        # the gradient UPerNet's fusion hands an upsampled level: a channel slice of cat's gradient
        g = torch.randn(2, 24, 28, 20, dtype=dtype).contiguous(memory_format=layout)[:, 8:16]
        ya.backward(g)
        yb.backward(g)
        tol = 1e-6 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(b.grad, a.grad, rtol=tol, atol=tol)
        assert b.grad.is_contiguous(memory_format=layout)
        if layout == torch.contiguous_format:
            assert torch.equal(b.grad, a.grad)  # the same kernel on the same layout


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_upernets_fusion_mixes_the_coarse_maps_at_their_size_as_the_cat_would(layout):
    """fused_conv equals the conv of the cat of the resized maps in float64, values and every
    gradient, at odd sizes and non-integer scales (zero padding at each border); channels_last
    (AMX) runs the cat itself."""
    from cryocube.decoders.upernet import fused_conv, resize

    torch.manual_seed(0)
    conv = torch.nn.Conv2d(4 * 6, 5, 3, padding=1).double()
    maps = [
        torch.randn(2, 6, h, w, dtype=torch.float64).contiguous(memory_format=layout)
        for h, w in ((13, 11), (7, 6), (4, 3), (2, 2))
    ]

    def run(form):
        ms = [m.clone().requires_grad_() for m in maps]
        conv.zero_grad()
        y = form(ms)
        g = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=y.dtype)
        (y * g).sum().backward()
        return [y.detach(), *(m.grad for m in ms), conv.weight.grad.clone(), conv.bias.grad.clone()]

    size = maps[0].shape[2:]
    want = run(lambda ms: conv(torch.cat([ms[0], *(resize(m, size) for m in ms[1:])], 1)))
    got = run(lambda ms: fused_conv(conv, ms))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    if layout == torch.contiguous_format:  # in bf16 as training runs it: rounding apart
        with torch.autocast("cpu", dtype=torch.bfloat16):
            a = fused_conv(conv.float(), [m.float() for m in maps]).float()
            b = conv(torch.cat([maps[0], *(resize(m, size) for m in maps[1:])], 1).float()).float()
        assert ((a - b).norm() / b.norm()).item() < 2e-2


def test_the_necks_up_conv_and_the_lateral_conv_run_as_one_where_that_is_fewer_flops():
    """A 2x2 transposed conv then a 1x1 conv equal one transposed conv of the composed weight:
    values and every gradient in float64, and fewer FLOPs counted; where composing the weight
    costs more than it saves (one small map), the two convs run as they are."""
    from torch.utils.flop_counter import FlopCounterMode

    from cryocube.decoders.upernet import RESCALE, conv_bn_relu, up_lateral

    torch.manual_seed(0)
    op, lat = RESCALE[4](64).double().train(), conv_bn_relu(64, 32, 1).double().train()
    x0 = torch.randn(4, 64, 7, 7, dtype=torch.float64)
    g = torch.randn(4, 32, 28, 28, dtype=torch.float64)

    def run(form):
        x = x0.clone().requires_grad_()
        for p in (*op.parameters(), *lat.parameters()):
            p.grad = None
        with FlopCounterMode(display=False) as fc:
            y = form(x)
        (y * g).sum().backward()
        grads = [p.grad.clone() for p in (*op.parameters(), *lat.parameters())]
        return fc.get_total_flops(), [y.detach(), x.grad, *grads]

    (f_want, want), (f_got, got) = run(lambda x: lat(op(x))), run(lambda x: up_lateral(op, lat, x))
    for a, b in zip(got, want):  # (the lateral's bias under BatchNorm: a gradient of ~1e-12)
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    assert f_got < 0.8 * f_want, (f_got, f_want)
    # in the input's layout: a channels_last output would send UPerNet's fusion to its cat form
    assert got[0].is_contiguous()
    small = torch.randn(1, 64, 2, 2, dtype=torch.float64)  # composing would cost more: as it is
    with torch.no_grad():
        assert torch.equal(up_lateral(op.eval(), lat.eval(), small), lat(op(small)))


def test_a_vits_transposed_token_maps_take_the_same_fusion_as_contiguous_ones():
    """A ViT hands UPerNet its tokens transposed (not contiguous): the decoder still does the tap
    form's work, not the cat's, and gives the same logits."""
    from torch.utils.flop_counter import FlopCounterMode

    from cryocube.decoders.upernet import UPerNet

    torch.manual_seed(0)
    dec = UPerNet([32] * 4, 2, channels=16).double().eval()
    tokens = [torch.randn(2, 1 + 64, 32, dtype=torch.float64) for _ in range(4)]
    maps = [t[:, 1:].transpose(1, 2).reshape(2, 32, 8, 8) for t in tokens]
    assert not maps[0].is_contiguous()

    def run(feats):
        with torch.no_grad(), FlopCounterMode(display=False) as fc:
            y = dec(feats, (32, 32))
        return y, fc.get_total_flops()

    (y_t, f_t), (y_c, f_c) = run(maps), run([m.contiguous() for m in maps])
    assert f_t == f_c
    torch.testing.assert_close(y_t, y_c, rtol=1e-10, atol=1e-12)
