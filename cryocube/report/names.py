"""Display names and display order of models and datasets, as the Cryo-Bench paper prints them.

Our runs are keyed by catalog ids ("ssl4eo_moco"); the paper's table by display names ("S12-MoCo").
Tables join the two through the display name, so one mapping lives here.
"""
from __future__ import annotations

from functools import lru_cache

# Paper column order (README table of the Cryo-Bench snapshot) and display names.
DATASET_ORDER = ("glid", "gld", "sicd", "caffe", "gsdd")
DATASET_NAMES = {"glid": "GLID", "gld": "GLD", "sicd": "SICD", "caffe": "CaFFe", "gsdd": "GSDD"}

# Paper row order (frozen-encoder table). Unknown models come after, alphabetically.
MODEL_ORDER = (
    "CROMA", "DOFA", "GFM-Swin", "Prithvi", "RemoteCLIP", "SatlasNet", "Scale-MAE", "SpectralGPT",
    "S12-MoCo", "S12-DINO", "S12-MAE", "S12-Data2Vec", "TerraMind", "RAMEN", "U-Net", "ViT",
)

# Used when neither the record nor catalogs/models/<id>.yaml names the model.
MODEL_NAMES_FALLBACK = {
    "croma_optical": "CROMA", "croma_sar": "CROMA", "dofa": "DOFA", "gfmswin": "GFM-Swin",
    "prithvi": "Prithvi", "remoteclip": "RemoteCLIP", "satlasnet_si": "SatlasNet", "scalemae": "Scale-MAE",
    "spectralgpt": "SpectralGPT", "ssl4eo_moco": "S12-MoCo", "ssl4eo_dino": "S12-DINO",
    "ssl4eo_mae_optical": "S12-MAE", "ssl4eo_mae_sar": "S12-MAE", "ssl4eo_data2vec": "S12-Data2Vec",
    "terramind_base": "TerraMind", "terramind_large": "TerraMind", "terramind_large_sar": "TerraMind",
    "ramen": "RAMEN", "ramen_monotemporal": "RAMEN", "unet": "U-Net", "vit_scratch": "ViT",
}

# Protocol display order and titles.
PROTOCOL_ORDER = ("frozen", "fewshot", "finetune", "cross_sensor")
PROTOCOL_TITLES = {
    "frozen": "Frozen encoder, UPerNet decoder",
    "fewshot": "Few-shot (limited labels), frozen encoder",
    "finetune": "Full fine-tuning",
    "cross_sensor": "Cross-sensor",
}


@lru_cache(maxsize=None)
def _catalog_model_name(model_id: str) -> str | None:
    from ..catalog import load_yaml
    from ..errors import UserError

    try:
        spec = load_yaml("models", model_id)
    except (UserError, OSError, ValueError):
        return None
    name = spec.get("display_name")
    return str(name) if name else None


def model_display_name(model_id: str, record_name: str | None = None) -> str:
    """The record's own name first, then the model catalog, then the built-in fallback, then the id."""
    if record_name:
        return str(record_name)
    return _catalog_model_name(model_id) or MODEL_NAMES_FALLBACK.get(model_id, model_id)


def dataset_display_name(dataset_id: str) -> str:
    return DATASET_NAMES.get(dataset_id.lower(), dataset_id)


def dataset_id_from_name(name: str) -> str:
    """Inverse of dataset_display_name for published tables whose headers are display names."""
    for k, v in DATASET_NAMES.items():
        if v.lower() == name.strip().lower():
            return k
    return name.strip().lower()


def model_sort_key(name: str) -> tuple[int, str]:
    return (MODEL_ORDER.index(name), "") if name in MODEL_ORDER else (len(MODEL_ORDER), name.lower())


def dataset_sort_key(dataset_id: str) -> tuple[int, str]:
    d = dataset_id.lower()
    return (DATASET_ORDER.index(d), "") if d in DATASET_ORDER else (len(DATASET_ORDER), d)


def protocol_sort_key(protocol: str) -> tuple[int, str]:
    return (PROTOCOL_ORDER.index(protocol), "") if protocol in PROTOCOL_ORDER else (len(PROTOCOL_ORDER), protocol)
