"""The GPU check script (ssd_bench/backbone_speed.py), run at a tiny size on CPU."""

import json

import pytest
import torch

from ssd_bench import backbone_speed
from ssd_bench.backbone_speed import build, janus_pro_config, main, measure, project


def test_the_7b_shape_is_janus_pros_generation_path():
    backbone, heads = build(janus_pro_config(), torch.device("meta"), torch.bfloat16)  # shapes only, no memory
    language_model = sum(p.numel() for p in backbone.model.model.language_model.parameters())
    assert 6.4e9 < language_model < 6.6e9  # 30 Llama layers of 4096 and a 102,400-token embedding
    assert (backbone.grid.rows, backbone.grid.cols, backbone.grid.codebook_size) == (24, 24, 16384)
    assert backbone.image_size == (384, 384) and heads.config.hidden_size == backbone.hidden_size == 4096


def test_a_hand_checked_projection():
    """Prefill 1 s, AR step 0.5 s, row pass 2 s, heads 0.5 s, 10 AR passes: AR takes 6 s; SSD in 2 passes 6 s
    (no faster), in 4 passes 11 s."""
    seconds = {"prefill": 1.0, "ar_step": 0.5, "row_pass": 2.0, "heads": 0.5}
    projected = project(seconds, 10, (2, 4))
    assert projected == pytest.approx(
        {"ar_seconds": 6.0, "ssd_2_seconds": 6.0, "ssd_2_speedup": 1.0, "ssd_4_seconds": 11.0, "ssd_4_speedup": 6 / 11}
    )


def test_each_timed_pass_runs_the_tokens_it_names(monkeypatch):
    """The AR step runs one token per guidance row, the row pass a whole row, each from the same cache."""
    backbone, heads = build(janus_pro_config(tiny=True), torch.device("cpu"), torch.float32)
    extended, lengths = [], []
    extend = backbone.extend

    def counting_extend(state, embeds):
        lengths.append(state.length)
        extended.append(embeds.shape[0] * embeds.shape[1])
        return extend(state, embeds)

    def tokens_run(step, device, repeats, warmup=3):
        """In place of a timing: the tokens one run of `step` sends through the backbone."""
        before = len(extended)
        step()
        return sum(extended[before:])

    monkeypatch.setattr(backbone, "extend", counting_extend)
    monkeypatch.setattr(backbone_speed, "median_seconds", tokens_run)
    images, cols = 3, backbone.grid.cols
    tokens = measure(backbone, heads, images, prompt_tokens=5, repeats=1)
    assert tokens == {"prefill": 0, "ar_step": 2 * images, "row_pass": 2 * images * cols, "heads": 0}
    assert len(set(lengths[1:])) == 1 and lengths[1] > lengths[0]  # both passes start past half the image


def test_tiny_run_writes_every_timing_and_projection(tmp_path):
    result = main(["--tiny", "--images", "1", "2", "--repeats", "2", "--out", str(tmp_path / "check.json")])
    written = json.loads((tmp_path / "check.json").read_text())
    assert written["grid"] == [4, 4] == result["grid"]
    assert {"device", "dtype", "torch", "backbone_parameters", "build_seconds", "total_seconds"} <= written.keys()
    assert written["device"] == "cpu" and written["backbone_parameters"] > 0
    assert list(written["batches"]) == ["1", "2"]
    for batch in written["batches"].values():
        seconds, projected = batch["seconds"], batch["projected"]
        assert set(seconds) == {"prefill", "ar_step", "row_pass", "heads"}
        assert all(value > 0 for value in seconds.values())
        assert set(projected) == {"ar_seconds", "ssd_6_seconds", "ssd_6_speedup", "ssd_8_seconds", "ssd_8_speedup"}
        assert projected["ar_seconds"] > seconds["prefill"] + seconds["ar_step"]
        assert seconds["prefill"] < projected["ssd_6_seconds"] < projected["ssd_8_seconds"]
        assert projected["ssd_6_speedup"] > projected["ssd_8_speedup"] > 0
    assert written["total_seconds"] >= written["build_seconds"]
