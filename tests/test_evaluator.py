"""The GenEval-style scorer: passes ground-truth renders, fails renders with one claim broken."""

import dataclasses

import numpy as np
import pytest
from PIL import Image

from ssd_pipelines.reference.evaluator import detect, evaluate, score
from ssd_pipelines.reference.scenes import COLORS, TASKS, make_dataset, render_objects


@pytest.fixture(scope="module")
def scenes():
    return make_dataset(400, seed=2024)


def test_ground_truth_renders_pass(scenes):
    report = evaluate([s.image for s in scenes], [s.spec for s in scenes])
    assert set(report["per_task"]) == set(TASKS)
    assert report["accuracy"] >= 0.95
    assert all(acc >= 0.9 for acc in report["per_task"].values()), report["per_task"]
    assert report["overall"] == pytest.approx(np.mean(list(report["per_task"].values())))
    assert sum(report["per_task_n"].values()) == report["n"] == 400


def test_scorer_does_not_read_rendered_boxes(scenes):
    for s in scenes[:60]:
        blind = dataclasses.replace(s.spec, rendered=())
        assert score(s.image, blind) == score(s.image, s.spec)


def test_accepts_pil_and_float_images(scenes):
    s = scenes[0]
    expected = score(s.image, s.spec)
    assert score(Image.fromarray(s.image), s.spec) == expected
    assert score(s.image.astype(np.float32) / 255.0, s.spec) == expected


def test_background_alone_has_no_detections():
    for seed in range(40):
        assert detect(render_objects((), seed)) == []


def test_wrong_colour_fails(scenes):
    tried = 0
    for s in scenes:
        if s.spec.task not in ("colors", "color_attr", "counting", "position"):
            continue
        taken = {o.color for o in s.spec.objects}
        target = s.spec.objects[0]
        victim = next(i for i, r in enumerate(s.spec.rendered) if r.color == target.color and r.shape == target.shape)
        new_colour = next(c for c in COLORS if c not in taken)
        objects = list(s.spec.rendered)
        objects[victim] = dataclasses.replace(objects[victim], color=new_colour)
        assert not score(render_objects(objects, seed=tried), s.spec)["passed"], s.caption
        tried += 1
    assert tried > 100


def test_wrong_count_fails(scenes):
    tried = 0
    for s in scenes:
        if s.spec.task != "counting":
            continue
        assert not score(render_objects(s.spec.rendered[:-1], seed=tried), s.spec)["passed"], s.caption
        tried += 1
    assert tried > 40


def test_swapped_position_fails(scenes):
    tried = relation_caught = 0
    for s in scenes:
        if s.spec.task != "position":
            continue
        a, b = s.spec.rendered
        swapped = (
            dataclasses.replace(a, centre=b.centre, box=b.box),
            dataclasses.replace(b, centre=a.centre, box=a.box),
        )
        result = score(render_objects(swapped, seed=tried), s.spec)
        assert not result["passed"], s.caption
        relation_caught += result["relation_ok"] is False
        tried += 1
    assert tried > 40
    # Mostly the relation check itself rejects it (not a detection failure caused by the swap).
    assert relation_caught >= 0.9 * tried
