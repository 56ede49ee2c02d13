"""The sampling sweep runs end to end (on a tiny random pipeline: the numbers mean nothing here)."""

import argparse

import pytest

from ssd_bench.commands import sweep_setting
from ssd_bench.sweep import main
from ssd_pipelines.testing import tiny_pipeline


def test_a_setting_fills_the_defaults_and_converts_types():
    assert sweep_setting("guidance=5,top_k=50") == {"guidance": 5.0, "temperature": 1.0, "top_k": 50}
    assert sweep_setting("temperature=0.8") == {"guidance": 3.0, "temperature": 0.8, "top_k": 0}


@pytest.mark.parametrize("text", ["guidence=5", "guidance", "guidance=5,top_k=", "top_k=many"])
def test_a_setting_names_the_keys_it_knows(text):
    with pytest.raises(argparse.ArgumentTypeError, match="write key=value with keys guidance, temperature, top_k"):
        sweep_setting(text)


def test_sweep_prints_one_row_per_setting_against_the_first(tmp_path, capsys):
    tiny_pipeline(rows=16, cols=16).save_pretrained(tmp_path / "model")
    out = tmp_path / "sweep.md"
    settings = ["guidance=3", "guidance=1", "guidance=3,temperature=0.5,top_k=4"]
    main(
        [
            *("--model", str(tmp_path / "model"), "--prompts", "3", "--batch-size", "2", "--out", str(out)),
            *("--reference-renders", "16"),
            *(arg for setting in settings for arg in ("--setting", setting)),
        ]
    )
    printed = capsys.readouterr().out
    overall, per_task = printed.split("Adherence per task")
    rows = [line for line in overall.splitlines() if line.startswith("| ") and not line.startswith("| guidance")]
    assert [row.split(" | ")[:3] for row in rows] == [["| 3", "1", "-"], ["| 1", "1", "-"], ["| 3", "0.5", "4"]]
    assert rows[0].split(" | ")[-2] == "-" and "+-" in rows[1] and "+-" in rows[2]
    assert all(float(row.split(" | ")[-1].strip(" |")) > 0 for row in rows)  # a Fréchet distance each
    assert "| guidance | temperature | top-k | position | single_object |\n|---|---|---|---|---|\n" in per_task
    assert per_task.count("\n| 3 | 1 | - | ") == 1
    assert out.read_text().endswith(printed)


def test_sweep_compares_models_on_the_same_prompts(tmp_path, capsys):
    pipe = tiny_pipeline(rows=16, cols=16)
    models = [str(tmp_path / "model0"), str(tmp_path / "model1")]
    for model in models:
        pipe.save_pretrained(model)
    out = ["--out", str(tmp_path / "models.md"), "--reference-renders", "16"]
    main(["--model", models[0], "--model", models[1], "--setting", "guidance=3", "--prompts", "3", *out])
    overall = capsys.readouterr().out.split("Adherence per task")[0]
    rows = [line for line in overall.splitlines() if line.startswith("| ") and not line.startswith("| model")]
    assert [row.split(" | ")[0][2:] for row in rows] == models
    assert rows[0].split(" | ")[-2] == "-" and rows[1].split(" | ")[-2] == "+0.000 +- 0.000"  # the same weights
    assert rows[0].split(" | ")[-1] == rows[1].split(" | ")[-1]  # draw for draw: the same Fréchet distance


def test_sweep_rejects_a_bad_setting_before_loading_a_model(capsys):
    with pytest.raises(SystemExit):
        main(["--setting", "top-k=5", "--model", "/nonexistent"])
    assert "bad setting 'top-k=5'" in capsys.readouterr().err
