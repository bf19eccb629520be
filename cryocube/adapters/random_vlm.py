"""Tiny random-weight VLMs built from transformers configs (no downloads) for
`--allow-random-weights`: they measure the pipeline, never a model's skill. Two processor/model
contracts: LLaVA (an image token per patch) and Qwen2-VL (patches merged 2x2, multimodal rotary
positions). A word-level tokenizer of the tasks' answer words keeps greedy answers parseable."""

from __future__ import annotations

import hashlib
from typing import Callable

WORDS = (
    "low medium high coherence coherent fringe fringes none no one two three deformation uplift"
    " subsidence ring north south east west centre noise atmospheric orbital ramp turbulent"
    " decorrelated area the a is of in and 0 1 2 3 4 5 6 7 8 9 0.1 0.2 0.3 0.4 0.5 0.6 0.7 0.8 0.9"
    " , . [ ] :"
).split()
SPECIAL = ("<pad>", "<unk>", "<s>", "</s>", "<image>")
PREFIX = "random-"  # transformers:random-<arch>
# the 2-layer, 32-wide transformer of every tower
TINY = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4)


def chat(image: str = "<image>") -> str:
    """The chat template: the picture's placeholder (`image`: the architecture's), then the text."""
    return (
        "{% for m in messages %}{% for c in m['content'] %}{% if c['type'] == 'image' %}"
        + image
        + " {% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endfor %}{% if add_generation_prompt"
        " %} answer :{% endif %}"
    )


def tokenizer(extra: dict[str, str] | None = None):
    """The word-level tokenizer; `extra` adds an architecture's tokens {attribute: token}."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    extra = extra or {}
    vocab = {w: i for i, w in enumerate(SPECIAL + tuple(extra.values()) + tuple(WORDS))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        extra_special_tokens={"image_token": "<image>", **extra},
        padding_side="left",
    )


def text_config(tok) -> dict:
    """The language model of both architectures, sized to the tokenizer."""
    ids = {f"{k}_token_id": getattr(tok, f"{k}_token_id") for k in ("pad", "bos", "eos")}
    return dict(
        TINY, vocab_size=len(tok), num_key_value_heads=2, max_position_embeddings=512, **ids
    )


def seeded(cls, cfg, seed: int, tok):
    """`cls(cfg)` built under `seed` without touching the caller's random state."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(cfg)
    model.generation_config.pad_token_id = tok.pad_token_id
    return model


def llava(seed: int, image_size: int = 16, patch: int = 4):
    """LLaVA: a 2-layer CLIP vision tower of 16 px pictures, a 2-layer 32-wide Llama."""
    import transformers as hf

    tok = tokenizer()
    n_img = (image_size // patch) ** 2 + 1  # + CLS ("full" feature selection keeps it)
    vc = hf.CLIPVisionConfig(
        **TINY, image_size=image_size, patch_size=patch, num_channels=3, projection_dim=32
    )
    tc = hf.LlamaConfig(**text_config(tok))
    cfg = hf.LlavaConfig(
        vision_config=vc,
        text_config=tc,
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        image_seq_length=n_img,
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
    )
    model = seeded(hf.LlavaForConditionalGeneration, cfg, seed, tok)
    ip = hf.CLIPImageProcessor(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
    )
    proc = hf.LlavaProcessor(
        image_processor=ip,
        tokenizer=tok,
        patch_size=patch,
        vision_feature_select_strategy="full",
        image_token="<image>",
        num_additional_image_tokens=1,
        chat_template=chat(),
    )
    return model.eval(), proc


def qwen2_vl(seed: int, pixels: int = 16 * 16, patch: int = 4, merge: int = 2):
    """Qwen2-VL: a vision tower merging 4 px patches 2x2 (pictures of about `pixels`), a Qwen2 with
    multimodal rotary positions (left padding in its position ids)."""
    import transformers as hf

    marks = {
        "vision_start_token": "<|vision_start|>",
        "vision_end_token": "<|vision_end|>",
        "video_token": "<|video_pad|>",
    }
    tok = tokenizer(marks)
    ids = {f"{k}_id": tok.convert_tokens_to_ids(t) for k, t in marks.items()}
    vc = dict(
        depth=2,
        embed_dim=32,
        hidden_size=32,
        num_heads=4,
        mlp_ratio=1,
        patch_size=patch,
        spatial_merge_size=merge,
        temporal_patch_size=2,
    )
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}
    tc = dict(text_config(tok), rope_parameters=rope)
    cfg = hf.Qwen2VLConfig(
        text_config=tc, vision_config=vc, image_token_id=tok.convert_tokens_to_ids("<image>"), **ids
    )
    model = seeded(hf.Qwen2VLForConditionalGeneration, cfg, seed, tok)
    geom = dict(patch_size=patch, merge_size=merge, temporal_patch_size=2)
    proc = hf.Qwen2VLProcessor(
        image_processor=hf.Qwen2VLImageProcessor(min_pixels=pixels, max_pixels=pixels, **geom),
        video_processor=hf.Qwen2VLVideoProcessor(**geom),
        tokenizer=tok,
        chat_template=chat(f"{marks['vision_start_token']}<image>{marks['vision_end_token']}"),
    )
    return model.eval(), proc


ARCHS: dict[str, Callable] = {"llava": llava, "qwen2-vl": qwen2_vl}


def build(arch: str, seed: int):
    """The (model, processor) of a random architecture, the same weights for one seed everywhere."""
    return ARCHS[arch](seed)


def loaded_as(model, dtype):
    """The model as from_pretrained(dtype=...) loads it, built in `dtype`: `.to(dtype)` would also
    round the rotary tables from_pretrained keeps in float32, and so answer differently."""
    if next(model.parameters()).dtype == dtype:
        return model
    out = type(model)._from_config(model.config, dtype=dtype)
    out.load_state_dict(model.state_dict())
    out.generation_config = model.generation_config
    return out.eval()


def state_sha256(model) -> str:
    """sha256 of a model's parameters and buffers in name order (a random model's record)."""
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()
