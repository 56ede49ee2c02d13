"""The drafters benchmark runs end to end (on a tiny random pipeline: the numbers mean nothing here)."""

import pytest
from PIL import Image

from ssd_bench.drafters import DECODINGS, main, parse_heads
from ssd_pipelines.decoding.ssd import SSDDecoding
from ssd_pipelines.testing import tiny_pipeline
from ssd_pipelines.testing.engine_probes import drafting_clock


def test_drafters_benchmark_writes_one_row_per_heads_and_decoding(tmp_path, capsys):
    pipe = tiny_pipeline(rows=16, cols=16)
    pipe.save_pretrained(tmp_path / "model")
    out = tmp_path / "drafters.md"
    heads = tmp_path / "model" / "heads"
    main(
        [
            *("--model", str(tmp_path / "model"), "--heads", f"a=b={heads}", "--heads", f"second={heads}"),
            *("--prompts", "2", "--images-per-prompt", "2", "--batch-size", "4", "--repeats", "1"),
            *("--reference-renders", "16", "--out", str(out)),
        ]
    )
    printed = capsys.readouterr().out
    table, targets = printed.split("Against the targets")
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [(r[0][2:], r[1]) for r in rows] == [("-", "ar")] + [(h, d) for h in ("a=b", "second") for d in DECODINGS]
    assert rows[0][3] == "256" and rows[0][4] == "1.0x"  # AR: one pass per code of 16 x 16
    exact_columns = [2, 3, 4, 8, 9, 10, 11, 12]  # all but the timings
    same = 1 + len(DECODINGS)  # the second heads' first row: the same heads again
    assert [rows[1][i] for i in exact_columns] == [rows[same][i] for i in exact_columns]
    assert all(r[7].endswith("%") for r in rows) and rows[0][7] == "0%"  # AR drafts nothing
    assert out.read_text().endswith(printed) and Image.open(out.with_suffix(".png")).size[0] > 0
    exact_passes = [line for line in targets.splitlines() if line.startswith("| exact: fewer passes than AR |")]
    assert "| target | bound | a=b | second |" in targets and len(exact_passes) == 1
    assert exact_passes[0].split(" | ")[2] == f"{256 / float(rows[len(DECODINGS)][3]):.1f}x"  # a=b's exact row


def test_the_drafting_clock_counts_drafting_only_and_restores_the_methods():
    original = SSDDecoding._draft_below
    pipe = tiny_pipeline()
    with drafting_clock() as spent:
        pipe("a red circle", decoding="ar", output_type="latent")
    assert spent[0] == 0.0
    with drafting_clock() as spent:
        out = pipe("a red circle", decoding="ssd", output_type="latent")
    assert 0 < spent[0] < out.stats["seconds"]
    assert SSDDecoding._draft_below is original


def test_heads_are_given_as_label_and_folder():
    assert [str(p) for p in parse_heads(["x=1=/a/b"]).values()] == ["/a/b"]
    with pytest.raises(SystemExit, match="--heads takes LABEL=FOLDER"):
        parse_heads(["folder-only"])
