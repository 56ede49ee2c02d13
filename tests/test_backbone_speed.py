"""The GPU check script (ssd_pipelines/benchmarks/backbone_speed.py), run at a tiny size on CPU."""

import json

import pytest
import torch

from ssd_pipelines.benchmarks.backbone_speed import build, janus_pro_config, main


def test_the_7b_shape_is_janus_pros_generation_path():
    backbone, heads = build(janus_pro_config(), torch.device("meta"), torch.bfloat16)  # shapes only, no memory
    language_model = sum(p.numel() for p in backbone.model.model.language_model.parameters())
    assert 6.4e9 < language_model < 6.6e9  # 30 Llama layers of 4096 and a 102,400-token embedding
    assert (backbone.grid.rows, backbone.grid.cols, backbone.grid.codebook_size) == (24, 24, 16384)
    assert backbone.image_size == (384, 384) and heads.config.hidden_size == backbone.hidden_size == 4096


def test_tiny_run_times_every_pass_and_projects_from_them(tmp_path):
    result = main(["--tiny", "--images", "1", "2", "--repeats", "2", "--out", str(tmp_path / "check.json")])
    assert json.loads((tmp_path / "check.json").read_text())["grid"] == [4, 4] == result["grid"]
    for batch in result["batches"].values():
        seconds, projected = batch["seconds"], batch["projected"]
        assert all(value > 0 for value in seconds.values())
        ar = seconds["prefill"] + 16 * seconds["ar_step"]
        ssd = seconds["prefill"] + 6 * (seconds["row_pass"] + seconds["heads"])
        assert projected["ar_seconds"] == pytest.approx(ar) and projected["ssd_6_speedup"] == pytest.approx(ar / ssd)
