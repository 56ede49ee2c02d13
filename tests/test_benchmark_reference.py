"""The reference benchmark runs end to end (on a tiny random pipeline: the numbers mean nothing here)."""

import re
from pathlib import Path

import pytest
import torch

from ssd_bench import main as run_bench
from ssd_bench.reference import (
    DECODINGS,
    choose_default,
    main,
    paired_difference,
    per_task_table,
)
from ssd_pipelines.decoding import DEFAULT_DECODING
from ssd_pipelines.testing import tiny_pipeline


def test_reference_benchmark_prints_and_writes_its_table(tmp_path, capsys):
    tiny_pipeline(rows=16, cols=16).save_pretrained(tmp_path / "model")
    out = tmp_path / "bench.md"
    main(
        [
            *("--model", str(tmp_path / "model"), "--prompts", "3", "--images-per-prompt", "2"),
            *("--batch-size", "4", "--repeats", "1", "--reference-renders", "16", "--out", str(out)),
        ]
    )
    printed = capsys.readouterr().out
    overall, per_task = printed.split("Adherence per task")

    def decodings(table):
        rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| decoding")]
        return [row.split(" | ")[0][2:] for row in rows]

    assert decodings(overall) == decodings(per_task) == list(DECODINGS)
    assert "| ar | " in printed and "| 256 | 1.0x |" in printed  # AR: one pass per code of 16 x 16
    ar = next(line for line in overall.splitlines() if line.startswith("| ar |")).split(" | ")
    assert ar[2] == "-" and float(ar[3]) > 0  # no paired difference to itself; a Fréchet distance
    assert ar[8] == "0%"  # AR drafts nothing
    assert "Default by this run's rule (the fewest passes whose Fréchet distance is within 1.5x of AR's" in overall
    assert out.read_text().endswith(printed)


def test_ssd_bench_names_its_benchmarks():
    with pytest.raises(
        SystemExit,
        match="usage: ssd-bench {exactness,reference,sweep,peers,window,pipelined,drafters,recheck,serve,gpu,quantization}",
    ):
        run_bench(["nonsense"])


def test_paired_difference_is_the_difference_of_task_averaged_adherence():
    def results(task_passes):
        return [{"task": task, "passed": bool(p)} for task, passes in task_passes for p in passes]

    ours = results([("colors", [1, 1, 0, 0]), ("counting", [1, 1])])  # adherence (0.5 + 1) / 2
    base = results([("colors", [0, 1, 0, 1]), ("counting", [0, 0])])  # adherence (0.5 + 0) / 2
    diff, se = paired_difference(ours, base)
    assert diff == pytest.approx(0.5)
    # colors: differences [1, 0, 0, -1], sample variance 2/3 over 4 prompts; counting: no spread; two tasks
    assert se == pytest.approx(((2 / 3) / 4) ** 0.5 / 2)


def test_paired_difference_treats_a_prompts_images_as_one_sample():
    ours = [{"task": t, "passed": p} for t, p in [("colors", 1), ("colors", 1), ("colors", 0), ("colors", 0)]]
    ours += [{"task": "counting", "passed": 1}, {"task": "counting", "passed": 0}]
    base = [{"task": t, "passed": p} for t, p in [("colors", 0), ("colors", 1), ("colors", 0), ("colors", 1)]]
    base += [{"task": "counting", "passed": 0}, {"task": "counting", "passed": 0}]
    diff, se = paired_difference(ours, base, images_per_prompt=2)
    assert diff == pytest.approx(paired_difference(ours, base)[0]) == pytest.approx(0.25)
    # colors: per-prompt differences [0.5, -0.5], sample variance 0.5 over 2 prompts; counting: one prompt
    assert se == pytest.approx((0.5 / 2) ** 0.5 / 2)


def test_per_task_table_has_a_row_per_decoding_and_a_column_per_task():
    quality = [
        {"label": "ar", "per_task": {"colors": 0.5, "counting": 0.25}},
        {"label": "ssd r=1", "per_task": {"colors": 0.75, "counting": 0.0}},
    ]
    assert per_task_table(quality) == [
        "| decoding | colors | counting |",
        "|---|---|---|",
        "| ar | 0.500 | 0.250 |",
        "| ssd r=1 | 0.750 | 0.000 |",
    ]


def test_the_default_is_the_fewest_passes_that_keep_ars_look_and_adherence():
    rows = [
        {"label": "ar", "passes": 256, "frechet": 80, "adherence_diff": 0.0},
        {"label": "ssd r=2", "passes": 54, "frechet": 650, "adherence_diff": -0.13},  # far from AR's look
        {"label": "ssd W=17 r=6", "passes": 70, "frechet": 118, "adherence_diff": -0.02},  # 118 <= 1.5 x 80
        {"label": "exact", "passes": 83, "frechet": 65, "adherence_diff": 0.001},
    ]
    assert choose_default(rows).endswith("**ssd W=17 r=6**, 70 passes.")
    rows[2]["adherence_diff"] = -0.14  # AR's look, but stray fragments miss the colours
    assert choose_default(rows).endswith("**exact**, 83 passes.")
    rows[2]["adherence_diff"], rows[2]["frechet"] = 0.0, 121
    assert choose_default(rows).endswith("**exact**, 83 passes.")
    rows[3]["frechet"] = 200
    assert choose_default(rows).endswith("none qualifies.")


def test_the_libraries_default_decodes_one_image_as_the_shipped_table_says():
    """docs/reference_benchmark.md names the default by its rule; the pipeline, CLI, demo and ComfyUI node share
    DEFAULT_DECODING. When a rerun names another decoding, this fails until the default follows it."""
    table = (Path(__file__).resolve().parents[1] / "docs" / "reference_benchmark.md").read_text()
    named = re.search(r"^Default by this run's rule .*: \*\*(.+)\*\*, \d+ passes\.$", table, re.MULTILINE).group(1)
    pipe = tiny_pipeline()
    out = pipe("a red circle", generator=torch.Generator().manual_seed(0))
    assert DEFAULT_DECODING == out.stats["strategy"] and out.stats["chosen_decoding"] == named == "exact"
