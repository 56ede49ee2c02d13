"""The procedural dataset: determinism, caption/spec consistency, geometry the evaluator relies on."""

import json

import numpy as np
import pytest

from ssd_pipelines.reference.scenes import (
    COLORS,
    HELDOUT_SEED_START,
    IMAGE_SIZE,
    PALETTE,
    RELATIONS,
    SHAPES,
    TASKS,
    VOCABULARY,
    SceneSpec,
    caption_for,
    is_heldout,
    iter_scenes,
    make_dataset,
    sample_scene,
    task_of,
    weighted_seeds,
)


@pytest.fixture(scope="module")
def scenes():
    return make_dataset(600, seed=123)


def test_same_seed_same_scene_and_seeds_differ():
    a, b, c = sample_scene(7), sample_scene(7), sample_scene(8)
    assert np.array_equal(a.image, b.image) and a.caption == b.caption and a.spec == b.spec
    assert not np.array_equal(a.image, c.image)


def test_image_format(scenes):
    for s in scenes[:20]:
        assert s.image.shape == (IMAGE_SIZE, IMAGE_SIZE, 3) and s.image.dtype == np.uint8


def test_all_tasks_shapes_colours_relations_occur(scenes):
    assert {s.spec.task for s in scenes} == set(TASKS)
    rendered = [o for s in scenes for o in s.spec.rendered]
    assert {o.shape for o in rendered} == set(SHAPES)
    assert {o.color for o in rendered} == set(COLORS)
    assert {o.size for o in rendered} == {"small", "large"}
    assert {s.spec.relation for s in scenes if s.spec.task == "position"} == set(RELATIONS)
    assert {len(s.spec.rendered) for s in scenes} == {1, 2, 3, 4}


def test_caption_words_are_in_the_fixed_vocabulary(scenes):
    words = {w for s in scenes for w in s.caption.split()}
    assert words == set(VOCABULARY)


def test_caption_examples():
    by_task = {}
    for s in make_dataset(100, seed=0):
        by_task.setdefault(s.spec.task, s)
    counting = by_task["counting"]
    obj = counting.spec.objects[0]
    assert counting.caption.split()[0] in {"two", "three", "four"}
    assert counting.caption.split()[1] == obj.color
    position = by_task["position"]
    assert position.spec.relation in position.caption


def test_rendered_objects_match_the_caption(scenes):
    for s in scenes:
        assert caption_for(s.spec) == s.caption
        expected = sum(o.count for o in s.spec.objects)
        assert len(s.spec.rendered) == expected
        for claim in s.spec.objects:
            hits = [
                r
                for r in s.spec.rendered
                if r.shape == claim.shape and claim.color in (None, r.color) and claim.size in (None, r.size)
            ]
            assert len(hits) >= claim.count, s.caption
        if s.spec.task in ("color_attr", "position"):
            assert s.spec.objects[0].color != s.spec.objects[1].color


def test_objects_inside_image_and_apart(scenes):
    for s in scenes:
        boxes = [r.box for r in s.spec.rendered]
        for x0, y0, x1, y1 in boxes:
            assert 0 <= x0 < x1 <= IMAGE_SIZE and 0 <= y0 < y1 <= IMAGE_SIZE
        for i, a in enumerate(boxes):
            for b in boxes[i + 1 :]:
                apart = a[2] < b[0] or b[2] < a[0] or a[3] < b[1] or b[3] < a[1]
                assert apart, s.caption


def test_position_relation_true_in_render(scenes):
    checked = 0
    for s in scenes:
        if s.spec.task != "position":
            continue
        (ax, ay), (bx, by) = s.spec.rendered[0].centre, s.spec.rendered[1].centre
        offset = {"left of": bx - ax, "right of": ax - bx, "above": by - ay, "below": ay - by}[s.spec.relation]
        assert offset >= 8, s.caption
        checked += 1
    assert checked > 50


def test_object_pixels_carry_the_object_colour(scenes):
    for s in scenes[:100]:
        for r in s.spec.rendered:
            cx, cy = (int(v) for v in r.centre)
            # The centre of every shape (the cross included) is inside it.
            assert np.abs(s.image[cy, cx].astype(int) - PALETTE[r.color]).max() <= 25


def test_images_have_natural_variation(scenes):
    for s in scenes[:50]:
        corner = s.image[:6, :6].astype(float)  # objects keep a 1-pixel margin, so corners are mostly background
        assert corner.std(axis=(0, 1)).max() > 0.5
        per_channel_std = s.image.reshape(-1, 3).std(axis=0)
        assert per_channel_std.max() > 3


def test_spec_serialises_to_json_and_back(scenes):
    for s in scenes[:50]:
        d = json.loads(json.dumps(s.spec.to_dict()))
        assert SceneSpec.from_dict(d) == s.spec


def test_heldout_split():
    assert is_heldout(HELDOUT_SEED_START) and not is_heldout(HELDOUT_SEED_START - 1)
    with pytest.raises(ValueError):
        make_dataset(10, seed=HELDOUT_SEED_START - 5)
    held = make_dataset(3, seed=HELDOUT_SEED_START)
    assert np.array_equal(held[0].image, sample_scene(HELDOUT_SEED_START).image)
    train_stream = list(iter_scenes(HELDOUT_SEED_START - 2))
    assert len(train_stream) == 2


def test_task_of_a_seed_is_its_scenes_task_without_rendering(scenes):
    assert [task_of(123 + i) for i in range(len(scenes))] == [scene.spec.task for scene in scenes]


def test_weighted_seeds_come_in_the_task_proportions():
    seeds = weighted_seeds(800, {"color_attr": 2, "position": 2})
    counts = {task: sum(task_of(s) == task for s in seeds) for task in TASKS}
    assert counts == {**dict.fromkeys(TASKS, 100), "color_attr": 200, "position": 200}
    assert seeds == sorted(set(seeds)) and seeds[0] == 0 and not is_heldout(seeds[-1])
    assert weighted_seeds(600, {}) != list(range(600))  # equal shares, not the first 600 seeds
    with pytest.raises(ValueError, match="unknown task.*colour_attr: choose among single_object"):
        weighted_seeds(10, {"colour_attr": 2})
    with pytest.raises(ValueError, match="task weights must be >= 0 and not all 0"):
        weighted_seeds(10, dict.fromkeys(TASKS, 0))
