"""ViTs on timm: one architecture (`vit`, timm's VisionTransformer) for every plain ViT of the
benchmark, and `ssl4eo_data2vec` (timm's BEiT).

timm supplies the patch embedding, blocks and `forward_intermediates`; what differs between the
ViT-based models (SSL4EO MoCo/DINO/MAE, Prithvi, RemoteCLIP, Scale-MAE, the scratch ViT: position
embedding kind, pre-norm, final norm on the last output, eps, biases) is a few constructor
arguments set from the catalog's `arch`, and the key map of their checkpoints (declared here). A
new ViT model is one YAML (architecture: vit).

Prithvi-100M is a 3-D ViT (Conv3d patch embedding, tubelet 1); with one frame the Conv3d is a Conv2d
with the time axis squeezed, which its key map does, and the position embedding is the 3-D sin-cos
for T=1 (recomputed). RemoteCLIP's OpenCLIP visual tower is timm's pre-norm CLIP ViT (bias-free
patch conv, ln_pre). Scale-MAE's GSD-scaled sin-cos at the protocol's input_res=1.0 is the MAE one.
"""

from __future__ import annotations

from functools import partial

import torch
from timm.models.beit import Beit
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor, nn

from .base import Encoder, Trunk, sincos_2d, sincos_2d_mocov3, sincos_3d, timm_intermediates
from .keymap import KeyMap, Rename, reshape_transform
from .registry import register_architecture, register_keymap

POS_EMBEDS = ("learn", "sincos", "mocov3", "sincos3d", "zeros")


def timm_args(enc: Encoder) -> dict:
    """The constructor arguments timm's VisionTransformer and Beit share, for `enc`."""
    t = enc.trunk
    return dict(
        img_size=enc.input_size,
        patch_size=t.patch_size,
        in_chans=enc.in_chans,
        num_classes=0,
        global_pool="token",
        embed_dim=t.embed_dim,
        depth=t.depth,
        num_heads=t.num_heads,
        mlp_ratio=t.mlp_ratio,
        drop_path_rate=t.drop_path_rate,
        norm_layer=partial(nn.LayerNorm, eps=t.norm_eps),
    )


@register_architecture("vit")
class TimmViTEncoder(Encoder):
    """A timm VisionTransformer returning the maps of `output_layers` (B, C, g, g).

    pos_embed: "learn" (trained, loaded), "sincos" (MAE 2-D), "mocov3" (MoCo-v3 2-D), "sincos3d"
    (Prithvi, T=1), "zeros" (the reference's scratch ViT, which never fills its frozen zeros).
    Fixed kinds are frozen parameters (as in the reference code) so checkpoints may carry them.
    `norm_last`: apply the final LayerNorm to the last returned map (DOFA/ViT-scratch behaviour);
    `final_norm`: keep the final LayerNorm at all (False when the reference encoder has none).
    """

    trunk = Trunk()

    def build(
        self,
        qkv_bias: bool = True,
        pos_embed: str = "learn",
        pre_norm: bool = False,
        final_norm: bool = False,
        norm_last: bool = False,
        input_res: float = 1.0,
    ):
        """The arguments of the models' `arch:`, as the class docstring explains them."""
        path = self.spec.path
        if pos_embed not in POS_EMBEDS:
            raise ValueError(f"{path}: pos_embed must be one of {POS_EMBEDS}, got {pos_embed!r}")
        if input_res != 1.0:
            raise ValueError(
                f"{path}: only input_res 1.0 (Scale-MAE at the protocol's value) is implemented"
            )
        grid, embed_dim = self.grid, self.trunk.embed_dim
        self.patch_size = self.trunk.patch_size
        self.norm_last = norm_last
        self.vit = VisionTransformer(
            **timm_args(self),
            qkv_bias=qkv_bias,
            class_token=True,
            pre_norm=pre_norm,
            final_norm=final_norm,
            act_layer=nn.GELU,
        )
        fixed = {
            "sincos": lambda: sincos_2d(embed_dim, grid, cls_token=True),
            "mocov3": lambda: torch.cat(
                [torch.zeros(1, 1, embed_dim), sincos_2d_mocov3(embed_dim, grid)], dim=1
            ),
            "sincos3d": lambda: sincos_3d(embed_dim, (1, grid, grid), cls_token=True),
            "zeros": lambda: torch.zeros(1, grid**2 + 1, embed_dim),
        }
        if pos_embed in fixed:
            with torch.no_grad():
                self.vit.pos_embed.copy_(fixed[pos_embed]())
            self.vit.pos_embed.requires_grad_(False)
        self.same_outputs(embed_dim, self.patch_size)

    def features(self, x: Tensor) -> list[Tensor]:
        """timm's intermediates before the final norm, unless `norm_last` norms the last one."""
        outs = timm_intermediates(self.vit, x, self.output_layers)
        if self.norm_last:
            outs[-1] = self.vit.norm(outs[-1].permute(0, 2, 3, 1)).permute(0, 3, 1, 2).contiguous()
        return outs


@register_architecture("ssl4eo_data2vec")
class Data2VecEncoder(Encoder):
    """SSL4EO-S12 Data2Vec ViT-S/16 on timm's BEiT: shared relative position bias, no absolute
    position, layer scale 0.1."""

    trunk = Trunk(embed_dim=384, num_heads=6)

    def build(self, init_values=0.1):
        """timm BEiT's layer scale, at SSL4EO Data2Vec's 0.1 by default."""
        self.beit = Beit(
            **timm_args(self),
            qkv_bias=True,
            use_abs_pos_emb=False,
            use_rel_pos_bias=False,
            use_shared_rel_pos_bias=True,
            init_values=init_values,
        )
        self.same_outputs(self.trunk.embed_dim, self.trunk.patch_size)

    def features(self, x: Tensor) -> list[Tensor]:
        """timm BEiT's intermediates, (B, D, H/16, W/16) per output layer, before the final norm."""
        return timm_intermediates(self.beit, x, self.output_layers)


# -- checkpoints of the models of the ViT architecture ------------------------------------------

VIT_PARTS = r"(patch_embed\..*|cls_token|pos_embed|blocks\..*)"
TIMM = (Rename("", "vit."),)

register_keymap(
    KeyMap(
        name="ssl4eo_moco",
        container=("state_dict",),
        prefix=("module.base_encoder.",),
        include=VIT_PARTS,
        renames=TIMM,
        notes=(
            "MoCo-v3 checkpoint: the momentum encoder, predictor, final norm and projection head"
            " are not part of the encoder"
        ),
    )
)
register_keymap(
    KeyMap(
        name="ssl4eo_dino",
        container=("teacher",),
        prefix=("backbone.",),
        include=r"(patch_embed\..*|cls_token|pos_embed|blocks\..*|norm\..*)",
        renames=TIMM,
        notes="DINO teacher backbone; the projection head is not part of the encoder",
    )
)
register_keymap(
    KeyMap(
        name="ssl4eo_mae",
        container=("model",),
        include=VIT_PARTS,
        renames=TIMM,
        notes="MAE checkpoint: mask token, final norm and decoder are not part of the encoder",
    )
)
register_keymap(
    KeyMap(
        name="prithvi",
        include=r"(patch_embed\.proj\..*|cls_token|blocks\..*)",
        transforms=(
            reshape_transform(
                "patch_embed.proj.weight",
                ref_shape=lambda s: (s[0], s[1], 1, s[2], s[3]),
                our_shape=lambda s: (s[0], s[1], s[-2], s[-1]) if len(s) == 5 else s,
            ),
        ),
        renames=TIMM,
        computed=(r"vit\.pos_embed",),
        notes=(
            "MAE checkpoint (3 frames): the 3-frame position embedding, mask token, norm and"
            " decoder are not used; the T=1 3-D sin-cos embedding is recomputed"
        ),
    )
)

register_keymap(
    KeyMap(
        name="remoteclip",
        prefix=("visual.",),
        require_prefix=True,
        include=r"(conv1\.weight|class_embedding|positional_embedding|ln_pre\..*|transformer\.resblocks\..*)",
        transforms=(
            reshape_transform(
                "class_embedding", ref_shape=lambda s: (s[-1],), our_shape=lambda s: (1, 1, s[-1])
            ),
            reshape_transform(
                "positional_embedding", ref_shape=lambda s: s[-2:], our_shape=lambda s: (1, *s[-2:])
            ),
        ),
        renames=(
            Rename("conv1.weight", "vit.patch_embed.proj.weight"),
            Rename("class_embedding", "vit.cls_token"),
            Rename("positional_embedding", "vit.pos_embed"),
            Rename("ln_pre.", "vit.norm_pre."),
            Rename("transformer.resblocks.{i}.ln_1.", "vit.blocks.{i}.norm1."),
            Rename("transformer.resblocks.{i}.ln_2.", "vit.blocks.{i}.norm2."),
            Rename(
                "transformer.resblocks.{i}.attn.in_proj_weight", "vit.blocks.{i}.attn.qkv.weight"
            ),
            Rename("transformer.resblocks.{i}.attn.in_proj_bias", "vit.blocks.{i}.attn.qkv.bias"),
            Rename("transformer.resblocks.{i}.attn.out_proj.", "vit.blocks.{i}.attn.proj."),
            Rename("transformer.resblocks.{i}.mlp.c_fc.", "vit.blocks.{i}.mlp.fc1."),
            Rename("transformer.resblocks.{i}.mlp.c_proj.", "vit.blocks.{i}.mlp.fc2."),
        ),
        notes=(
            "OpenCLIP state dict: the text tower, ln_post and the visual projection are not part of"
            " the encoder"
        ),
    )
)

register_keymap(
    KeyMap(
        name="scalemae",
        container=("model",),
        include=r"(patch_embed\.proj\..*|cls_token|blocks\..*)",
        renames=TIMM,
        computed=(r"vit\.pos_embed",),
        notes=(
            "Scale-MAE pre-training checkpoint: mask token, norm, decoder and FPN heads are not"
            " part of the encoder; positions are computed from the GSD (input_res 1.0), not stored"
        ),
    )
)


register_keymap(
    KeyMap(
        name="ssl4eo_data2vec",
        container=("model",),
        include=r"(patch_embed\..*|cls_token|rel_pos_bias\.relative_position_bias_table|blocks\..*|norm\..*)",
        renames=(Rename("", "beit."),),
        notes=(
            "BEiT-style checkpoint; mask token and the relative-position index buffer (recomputed)"
            " are set aside"
        ),
    )
)
