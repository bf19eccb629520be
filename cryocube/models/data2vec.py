"""SSL4EO-S12 Data2Vec ViT-S/16 on timm's BEiT (shared relative position bias, no absolute
position)."""

from __future__ import annotations

from functools import partial

from timm.models.beit import Beit
from torch import Tensor, nn

from .base import Encoder
from .keymap import KeyMap, Rename
from .registry import register_architecture, register_keymap

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


class Data2VecEncoder(Encoder):
    """BEiT ViT-S/16: shared relative position bias, no absolute position, layer scale 0.1."""

    def __init__(
        self,
        spec,
        in_chans,
        input_size,
        match=None,
        patch_size=16,
        embed_dim=384,
        depth=12,
        num_heads=6,
        mlp_ratio=4.0,
        init_values=0.1,
        norm_eps=1e-6,
        drop_path_rate=0.0,
    ):
        super().__init__(spec, in_chans, input_size, match)
        self.beit = Beit(
            img_size=input_size,
            patch_size=patch_size,
            in_chans=in_chans,
            num_classes=0,
            global_pool="token",
            embed_dim=embed_dim,
            depth=depth,
            num_heads=num_heads,
            mlp_ratio=mlp_ratio,
            qkv_bias=True,
            use_abs_pos_emb=False,
            use_rel_pos_bias=False,
            use_shared_rel_pos_bias=True,
            init_values=init_values,
            drop_path_rate=drop_path_rate,
            norm_layer=partial(nn.LayerNorm, eps=norm_eps),
        )
        self.output_channels = [embed_dim] * len(spec.output_layers)
        self.output_reductions = [float(patch_size)] * len(spec.output_layers)

    def features(self, x: Tensor) -> list[Tensor]:
        """timm BEiT's intermediates, (B, D, H/16, W/16) per output layer, before the final norm."""
        return list(
            self.beit.forward_intermediates(
                x,
                indices=self.output_layers,
                norm=False,
                output_fmt="NCHW",
                intermediates_only=True,
                stop_early=True,
            )
        )


@register_architecture("ssl4eo_data2vec")
def build_data2vec(spec, in_chans, input_size, match=None, **arch):
    """The `ssl4eo_data2vec` builder: the catalog's arch arguments go to timm's BEiT."""
    return Data2VecEncoder(spec, in_chans, input_size, match, **arch)
