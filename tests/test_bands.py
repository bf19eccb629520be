"""Band matching of every (model, dataset) pair of the Cryo-Bench grid, cross-sensor cases
included."""

from __future__ import annotations

import pytest

from cryocube.catalog import Band, load_dataset
from cryocube.models import BandMatchError, list_models, match_bands, model_spec
from cryocube.models.cli import bands_table

OPTICAL_DATASETS = ("glid", "gsdd", "gld")
ALL_ENCODERS = (
    "croma_optical",
    "dofa",
    "gfmswin",
    "prithvi",
    "remoteclip",
    "satlasnet_si",
    "scalemae",
    "spectralgpt",
    "ssl4eo_moco",
    "ssl4eo_dino",
    "ssl4eo_mae_optical",
    "ssl4eo_data2vec",
    "terramind_large",
    "ramen",
    "unet",
    "vit_scratch",
)
# Cryo-Bench README / protocol section 12: optical encoders get SAR through the RGB proxy configs.
SICD_OPTICAL = (
    "vit_scratch",
    "gfmswin",
    "prithvi",
    "remoteclip",
    "satlasnet_si",
    "scalemae",
    "spectralgpt",
    "ssl4eo_moco",
    "ssl4eo_dino",
    "ssl4eo_mae_optical",
    "ssl4eo_data2vec",
    "terramind_large",
)
SICD_SAR = ("dofa", "terramind_large_sar", "croma_sar", "ramen", "unet")
CAFFE_OPTICAL = (
    "gfmswin",
    "prithvi",
    "remoteclip",
    "satlasnet_si",
    "scalemae",
    "spectralgpt",
    "ssl4eo_moco",
    "ssl4eo_dino",
    "ssl4eo_data2vec",
    "vit_scratch",
)
CAFFE_SAR = ("croma_sar", "dofa", "ssl4eo_mae_sar", "terramind_large_sar", "ramen", "unet")

GRID = (
    [(m, d, "named") for d in OPTICAL_DATASETS for m in ALL_ENCODERS]
    + [(m, "sicd", "cross_sensor") for m in SICD_OPTICAL]
    + [(m, "sicd", "named") for m in SICD_SAR]
    + [(m, "caffe", "cross_sensor") for m in CAFFE_OPTICAL]
    + [(m, "caffe", "named") for m in CAFFE_SAR]
)


def _match(model, dataset, rule="named"):
    return match_bands(model_spec(model), load_dataset(dataset).bands, rule)


@pytest.mark.parametrize("model,dataset,rule", GRID)
def test_grid_pair_matches(model, dataset, rule):
    spec = model_spec(model)
    bands = load_dataset(dataset).bands
    m = match_bands(spec, bands, rule)
    assert len(m.slots) == len(m.index) == m.in_chans > 0
    assert any(i >= 0 for i in m.index), "no slot fed"
    assert all(-1 <= i < len(bands) for i in m.index)
    if not spec.takes_dataset_bands:
        assert m.slots == spec.slots
    text = m.table()
    assert model in text and text.count("\n") >= len(m.slots)
    # the cross-sensor rule applies exactly when a dataset without optical bands meets an
    # optical-only encoder
    no_optical = not any(b.alias.startswith("B") for b in bands)
    assert m.replicated == (rule == "cross_sensor" and no_optical and spec.optical_only)


def test_grid_covers_every_model():
    assert {m for m, _, _ in GRID} | {"terramind_base"} == set(list_models())


def test_prithvi_on_gld_takes_renamed_layers_and_zero_fills():
    m = _match("prithvi", "gld")
    names = [b.name for b in load_dataset("gld").bands]
    assert m.slots == ["B2", "B3", "B4", "B8A", "B11", "B12"]
    assert [names[i] if i >= 0 else None for i in m.index] == [
        "B2",
        "B3",
        "B4",
        "thermal",
        "B11",
        None,
    ]
    assert m.zero_slots == ["B12"]
    assert "zero-filled slots (1/6): B12" in m.table()
    assert "coherence" in m.table() and "not fed" in m.table()


def test_sar_encoder_on_gld_gets_coherence_as_vv_and_zero_vh():
    m = _match("croma_sar", "gld")
    assert m.slots == ["VV", "VH"]
    assert load_dataset("gld").bands[m.index[0]].name == "coherence"
    assert m.index[1] == -1


def test_dataset_encoders_follow_reference_modalities():
    gld = load_dataset("gld").bands
    assert _match("dofa", "gld").index == list(range(len(gld)))  # optical + sar modality: all 10
    vit = _match("vit_scratch", "gld")  # the reference ViT reads only the optical modality
    assert len(vit.index) == 9 and gld[6].name == "coherence" and 6 not in vit.index
    # the reference SICD config declares VV, VH only: incidence angle is not fed
    sicd = _match("unet", "sicd")
    assert sicd.slots == ["VV", "VH"] and sicd.index == [0, 1]
    assert "incidence_angle" in sicd.table() and "not a Cryo-Bench band name" in sicd.table()
    r = _match("ramen", "gld")
    assert r.slot_modality.count("sar") == 1 and r.slot_modality.count("optical") == 9


def test_cross_sensor_replicates_grey_band_into_rgb():
    m = _match("remoteclip", "caffe", "cross_sensor")
    assert m.slots == ["B4", "B3", "B2"] and m.index == [0, 0, 0] and m.replicated
    assert "replicated" in m.table()
    moco = _match("ssl4eo_moco", "caffe", "cross_sensor")
    fed = {s for s, i in zip(moco.slots, moco.index) if i >= 0}
    assert fed == {"B4", "B3", "B2"} and len(moco.zero_slots) == 10
    vit = _match("vit_scratch", "caffe", "cross_sensor")
    assert vit.slots == ["B4", "B3", "B2"] and vit.index == [0, 0, 0]


def test_cross_sensor_sicd_maps_hh_hv_incidence_to_b4_b3_b2():
    m = _match("scalemae", "sicd", "cross_sensor")
    names = [b.name for b in load_dataset("sicd").bands]
    assert dict(zip(m.slots, (names[i] for i in m.index))) == {
        "B4": "HH",
        "B3": "HV",
        "B2": "incidence_angle",
    }


def test_cross_sensor_on_optical_data_is_protocol():
    assert _match("remoteclip", "glid", "cross_sensor").index == _match("remoteclip", "glid").index
    assert not _match("remoteclip", "glid", "cross_sensor").replicated


@pytest.mark.parametrize(
    "model,dataset,rule",
    [
        ("remoteclip", "caffe", "named"),  # optical encoder, SAR data, no cross-sensor rule asked
        ("terramind_large", "sicd", "named"),  # the reference would feed 12 zero channels
        ("croma_sar", "glid", "named"),
        ("ssl4eo_mae_sar", "gsdd", "cross_sensor"),  # no rule feeds optical bands to a SAR encoder
        ("vit_scratch", "sicd", "named"),
    ],
)
def test_impossible_pairing_is_a_clear_error(model, dataset, rule):
    with pytest.raises(BandMatchError) as e:
        _match(model, dataset, rule)
    msg = str(e.value)
    assert model in msg and "dataset bands" in msg
    for b in load_dataset(dataset).bands:
        assert b.name in msg
    if rule == "named" and dataset in ("caffe", "sicd") and model_spec(model).optical_only:
        assert "cross_sensor" in msg


def test_bands_table_cli_helper_and_explicit_bands():
    text = bands_table("satlasnet_si", "gsdd")
    assert text.startswith("SatlasNet (satlasnet_si) <- dataset gsdd")
    assert "ancillary_8" in text and "zero-filled" not in text
    custom = [Band(name="nir", alias="B8", role="optical", wavelength_um=0.842)]
    assert "[0] nir" in bands_table("ssl4eo_moco", custom)


def test_unknown_rule_is_rejected():
    with pytest.raises(Exception, match="unknown band-matching rule"):
        _match("dofa", "gld", "best_effort")
