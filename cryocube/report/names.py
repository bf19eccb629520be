"""Display names and order of models, datasets and protocols, from the catalogs (runs are keyed by
catalog id, the paper's table by display name); anything they lack sorts after, by name."""

from __future__ import annotations

from functools import lru_cache

from ..catalog import CatalogError, dataset_ids, load_benchmark, load_dataset, load_yaml, protocols

BENCHMARK = "cryobench"  # the benchmark whose orders the report follows


@lru_cache(maxsize=None)
def model_display_name(model_id: str, record_name: str | None = None) -> str:
    """The record's own name first, then the model catalog's, then the id."""
    if record_name:
        return str(record_name)
    try:
        name = load_yaml("models", model_id).get("display_name")
    except (CatalogError, OSError):
        name = None
    return str(name) if name else model_id


@lru_cache(maxsize=None)
def _short_names() -> dict[str, str]:
    return {d: load_dataset(d).short_name for d in dataset_ids()}


def dataset_display_name(dataset_id: str) -> str:
    """The dataset catalog's short name (the paper's column header); an unknown id prints as is."""
    return _short_names().get(dataset_id.lower(), dataset_id)


def dataset_id_from_name(name: str) -> str:
    """Inverse of dataset_display_name for published tables whose headers are display names."""
    want = name.strip().lower()
    return next((k for k, v in _short_names().items() if v.lower() == want), want)


def protocol_title(protocol: str) -> str:
    """The protocol's title (catalogs/protocols.yaml) for headings; unknown ones print as named."""
    p = protocols().get(protocol)
    return p.title if p else protocol


def model_sort_key(name: str) -> tuple[int, str]:
    """Sorts display names in the benchmark catalog's row order; names it lacks follow, by name."""
    order = load_benchmark(BENCHMARK).model_order()
    return (order.index(name), "") if name in order else (len(order), name.lower())


def dataset_sort_key(dataset_id: str) -> tuple[int, str]:
    """Sorts dataset ids (any case) in the benchmark's dataset order; others follow, by name."""
    d, order = dataset_id.lower(), load_benchmark(BENCHMARK).datasets
    return (order.index(d), "") if d in order else (len(order), d)


def protocol_sort_key(protocol: str) -> tuple[int, str]:
    """Sorts protocols in catalogs/protocols.yaml's order; others follow, by name."""
    order = list(protocols())
    return (order.index(protocol), "") if protocol in order else (len(order), protocol)
