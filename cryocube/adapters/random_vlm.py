"""Tiny random-weight VLMs built from transformers configs (no downloads), for `--allow-random-weights`:
they measure the pipeline (batching, parsing, scoring, records), never a model's skill.

The tokenizer is built in code: a word-level vocabulary of the words the InSAR tasks' answers use, so a
random model's greedy answers are short strings of real words and numbers that the parsers can read.
Built under a fixed seed on CPU, so every worker builds the same weights (the record's sha256 says so).
"""
from __future__ import annotations

from typing import Callable

WORDS = ("low medium high coherence coherent fringe fringes none no one two three deformation uplift subsidence "
         "ring north south east west centre noise atmospheric orbital ramp turbulent decorrelated area the a is of in "
         "and 0 1 2 3 4 5 6 7 8 9 0.1 0.2 0.3 0.4 0.5 0.6 0.7 0.8 0.9 , . [ ] :").split()
SPECIAL = ("<pad>", "<unk>", "<s>", "</s>", "<image>")
CHAT = ("{% for m in messages %}{% for c in m['content'] %}{% if c['type'] == 'image' %}<image> {% else %}"
        "{{ c['text'] }}{% endif %}{% endfor %}{% endfor %}{% if add_generation_prompt %} answer :{% endif %}")


def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(SPECIAL + tuple(WORDS))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", extra_special_tokens={"image_token": "<image>"}, padding_side="left")


def llava(seed: int, image_size: int = 16, patch: int = 4):
    """LLaVA: a 2-layer CLIP vision tower of 16 px pictures, a 2-layer 32-wide Llama."""
    import torch
    from transformers import (CLIPImageProcessor, CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration,
                              LlavaProcessor)

    tok = tokenizer()
    n_img = (image_size // patch) ** 2 + 1  # + CLS ("full" feature selection keeps it)
    vc = CLIPVisionConfig(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                          image_size=image_size, patch_size=patch, num_channels=3, projection_dim=32)
    tc = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=512, pad_token_id=tok.pad_token_id,
                     bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    cfg = LlavaConfig(vision_config=vc, text_config=tc, image_token_index=tok.convert_tokens_to_ids("<image>"),
                      image_seq_length=n_img, vision_feature_layer=-1, vision_feature_select_strategy="full")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(cfg)
    model.generation_config.pad_token_id = tok.pad_token_id
    ip = CLIPImageProcessor(size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size})
    proc = LlavaProcessor(image_processor=ip, tokenizer=tok, patch_size=patch, vision_feature_select_strategy="full",
                          image_token="<image>", num_additional_image_tokens=1, chat_template=CHAT)
    return model.eval(), proc


ARCHS: dict[str, Callable] = {"llava": llava}


def build(arch: str, seed: int):
    return ARCHS[arch](seed)


def state_sha256(model) -> str:
    """sha256 of a model's parameters and buffers in name order (what a random model's record names)."""
    import hashlib

    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()
