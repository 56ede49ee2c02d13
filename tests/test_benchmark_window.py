"""ssd-bench window runs end to end (on a tiny random pipeline: the numbers mean nothing here)."""

import pytest

from ssd_bench.window import main
from ssd_pipelines.testing import tiny_pipeline


@pytest.mark.filterwarnings("ignore:.*unknown to this model's tokenizer")  # the tiny tokenizer knows few words
def test_window_benchmark_prints_and_writes_both_batch_sizes(tmp_path, capsys):
    tiny_pipeline(rows=4, cols=4).save_pretrained(tmp_path / "model")  # 4 rows of 4 codes + end-of-line
    out = tmp_path / "window.md"
    main(["--model", str(tmp_path / "model"), "--prompts", "8", "--windows", "3", "10", "--out", str(out)])
    printed = capsys.readouterr().out
    batch1, batch8 = printed.split("Batch 8")
    for table in (batch1, batch8):
        rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| decoding")]
        assert [row.split(" | ")[0][2:] for row in rows] == ["ar", "exact W=3", "exact W=10 (2 rows)"]
        assert rows[0].startswith("| ar | 16.0 | 1.0x | 18 |")  # one pass per code; all positions but the last 2
    assert out.read_text().endswith(printed)
