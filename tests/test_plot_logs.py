"""Training logs of every trainer become a loss-curve PNG; a file that is not a training log says so."""

import json

import pytest

from ssd_pipelines.training.plot_logs import loss_curve, main


def test_each_trainers_log_format_reads_as_steps_and_losses():
    assert loss_curve({"loss": [[0, 3.0], [10, 2.0]]}) == ([0, 10], [3.0, 2.0])  # distillation
    assert loss_curve({"loss": [{"step": 25, "loss": 1.5, "lr": 6e-4}]}) == ([25], [1.5])  # backbone
    assert loss_curve({"loss": [0.4, 0.3]}) == ([0, 1], [0.4, 0.3])  # VQ tokenizer


def test_plot_writes_a_png_and_rejects_a_log_without_losses(tmp_path):
    log = tmp_path / "distill_log.json"
    log.write_text(json.dumps({"loss": [[0, 3.0], [10, 2.0], [20, 1.5]]}))
    out = tmp_path / "docs" / "loss.png"
    main([f"heads={log}", "--out", str(out)])
    assert out.read_bytes()[:4] == b"\x89PNG"

    other = tmp_path / "model_index.json"
    other.write_text(json.dumps({"_class_name": "SSDAutoregressivePipeline"}))
    with pytest.raises(ValueError, match="no 'loss' entries"):
        main([str(other), "--out", str(out)])
    with pytest.raises(SystemExit, match="no training log at"):
        main([str(tmp_path / "missing.json"), "--out", str(out)])


def test_runs_of_different_batch_sizes_compare_by_sequences_seen():
    cpu = {"config": {"batch_size": 32}, "loss": [{"step": 25, "loss": 1.9}]}
    gpu = {"config": {"batch_size": 256}, "loss": [{"step": 25, "loss": 1.7}]}
    assert loss_curve(cpu, "sequences") == ([800], [1.9])
    assert loss_curve(gpu, "sequences") == ([6400], [1.7])
    with pytest.raises(ValueError, match="needs a backbone training log"):
        loss_curve({"loss": [[0, 3.0]]}, "sequences")
