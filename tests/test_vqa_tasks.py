"""Tasks as data: the catalog's four InSAR-VLM-Bench tasks, refusals naming the file and task,
prompts, rendering, and `cryocube list tasks|adapters`."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from cryocube.catalog import CatalogError
from cryocube.questions.render import render
from cryocube.questions.tasks import RenderSpec, all_tasks, fill, load_task_file


def test_the_four_tasks_are_catalog_data():
    t = all_tasks()
    assert {
        "coherence_classification",
        "deformation_localization",
        "fringe_counting",
        "noise_assessment",
    } <= set(t)
    c = t["coherence_classification"]
    assert c.labels == ("low", "medium", "high") and c.metrics == (
        ("accuracy", "target", "coherence_classification"),
    )
    assert [m for m, _, _ in t["deformation_localization"].metrics] == ["box_iou", "token_f1"]
    p = fill(
        t["fringe_counting"],
        {
            "primary_date": "2020-01-01",
            "secondary_date": "2020-01-13",
            "radar_wavelength_m": 0.05546576,
        },
    )
    # one fringe = lambda / 2
    assert "(2020-01-01 to 2020-01-13)" in p and "2.77 cm" in p and "{" not in p
    assert (
        fill(c, {"primary_date": "2020-01-01", "secondary_date": "2020-01-13"}).count("12 days")
        == 1
    )


@pytest.mark.parametrize(
    "change, said",
    [
        ({"prompt": "Count {fringes}."}, "prompt names unknown field {fringes}"),
        ({"answer": "poem"}, "answer 'poem' has no parser"),
        ({"metrics": {"bleu": {"answer": "x"}}}, "unknown metric 'bleu'"),
        ({"metrics": {"mae": {"pixels": "x"}}}, "metric mae: the reference must be one of"),
        ({"max_new_tokens": 0}, "max_new_tokens must be a positive integer"),
        ({"colour": "red"}, "unknown fields ['colour']"),
    ],
)
def test_a_bad_task_is_one_sentence_naming_file_and_task(tmp_path, change, said):
    task = {
        "answer": "number",
        "metrics": {"mae": {"target": "fringe_counting"}},
        "prompt": "How many fringes?",
    } | change
    f = tmp_path / "mine.yaml"
    f.write_text(yaml.safe_dump({"tasks": {"fringes": task}}))
    with pytest.raises(CatalogError) as e:
        load_task_file(f)
    assert f"{f}: task fringes:" in str(e.value) and said in str(e.value)


def test_rendering_phase_cyclic_and_coherence_grey():
    phase = np.array([[-np.pi, 0.0], [np.pi, np.nan]], np.float32)
    coh = np.array([[0.0, 0.5], [1.0, 0.25]], np.float32)
    img = render(np.stack([phase, coh]), ["wrapped_phase", "coherence"], RenderSpec(scale=2))
    assert img.shape == (4, 8, 3) and img.dtype == np.uint8
    # a cyclic colour map: -pi and +pi (the same phase) get the same colour; coherence is grey, 0
    # black and 1 white
    assert (img[0, 0] == img[2, 0]).all() and (img[0, 4] == 0).all() and (img[2, 4] == 255).all()
    assert len(set(img[0, 6])) == 1
    alone = render(
        np.stack([phase, coh]), ["wrapped_phase", "coherence"], RenderSpec(layout="phase")
    )
    assert alone.shape == (2, 2, 3)


def test_list_tasks_and_adapters(capsys):
    from cryocube.cli import main

    assert main(["list", "tasks"]) == 0
    out = capsys.readouterr().out
    assert "fringe_counting" in out and "class (low/medium/high)" in out
    assert main(["list", "adapters"]) == 0
    assert "transformers" in capsys.readouterr().out


@pytest.mark.parametrize(
    "change, said",
    [
        ({"prompts": ["How many?"]}, "give `prompt` (one phrasing) or `prompts`"),
        ({"prompt": None, "prompts": []}, "prompts must be a list of one or more phrasings"),
        (
            {"prompt": None, "prompts": ["How many?", "How  many?"]},
            "prompts lists the same phrasing twice",
        ),
        (
            {"prompt": None, "prompts": ["How many?", "Count {orbit}."]},
            "prompts[1] names unknown field {orbit}",
        ),
        (
            {"prompt": "Which? {choices}"},
            "lists {choices} (lettered options), which only a class answer has",
        ),
        ({"domain": [3, 0]}, "domain is [lowest, highest]"),
    ],
)
def test_bad_phrasings_and_domains_are_one_sentence(tmp_path, change, said):
    task = {
        "answer": "number",
        "metrics": {"mae": {"target": "fringe_counting"}},
        "prompt": "How many fringes?",
    } | change
    task = {k: v for k, v in task.items() if v is not None}
    f = tmp_path / "mine.yaml"
    f.write_text(yaml.safe_dump({"tasks": {"fringes": task}}))
    with pytest.raises(CatalogError) as e:
        load_task_file(f)
    assert f"{f}: task fringes:" in str(e.value) and said in str(e.value)


def test_phrasings_multiple_choice_and_the_digest(tmp_path):
    f = tmp_path / "mine.yaml"
    one = {
        "answer": "class",
        "labels": ["low", "medium", "high"],
        "metrics": {"accuracy": {"target": "coherence_classification"}},
        "prompt": "How coherent? Answer {labels}.",
    }
    many = one | {
        "prompt": None,
        "prompts": [
            "How coherent? Answer {labels}.",
            "Coherence? {choices}. Answer with a letter.",
        ],
    }
    f.write_text(
        yaml.safe_dump({"tasks": {"a": one, "b": {k: v for k, v in many.items() if v is not None}}})
    )
    t = load_task_file(f)
    assert t["a"].phrasings == ("How coherent? Answer {labels}.",) and len(t["b"].phrasings) == 2
    assert t["b"].prompt == t["a"].prompt  # the board's phrasing is the first
    assert t["a"].digest() != t["b"].digest()  # phrasings are part of what is asked
    assert fill(t["b"], {}, 1) == "Coherence? A. low; B. medium; C. high. Answer with a letter."
    assert not t["b"].parser_options(0)["letters"] and t["b"].parser_options(1)["letters"]
    assert all_tasks()["fringe_counting"].parser_options() == {"domain": (0.0, None)}
