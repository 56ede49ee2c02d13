"""`ssd-bench peers` runs end to end and says where each strategy stops beating AR (a tiny random pipeline:
the numbers mean nothing here)."""

from ssd_bench.peers import STRATEGIES, crossover, main
from ssd_pipelines.testing import tiny_pipeline


def test_peers_benchmark_writes_its_tables_and_figures(tmp_path):
    tiny_pipeline(rows=16, cols=16).save_pretrained(tmp_path / "model")  # 64 x 64 images, as the quality net reads
    out = tmp_path / "docs" / "benchmarks.md"
    main(
        [
            *("--model", str(tmp_path / "model"), "--prompts", "2", "--images-per-prompt", "1"),
            *("--quality-batch", "2", "--repeats", "1", "--batch-sizes", "1", "--sides", "4"),
            *("--reference-renders", "32", "--threads", "1", "--out", str(out)),
        ]
    )
    text = out.read_text()
    speed_table = text.split("Adherence per GenEval task")[0]
    for label in STRATEGIES:
        assert f"\n| {label} | " in speed_table
    assert "\n| ar | yes | 256 | 270 |" in speed_table  # one pass per code; 16 end-of-line tokens ride along
    assert "## Targets" in text and "sjd-pac" in text.split("## Targets")[1]
    for name in ("speed_quality", "throughput", "scaling", "images"):
        assert (out.parent / f"benchmarks_{name}.png").read_bytes()[:4] == b"\x89PNG"


def test_crossover_names_the_first_batch_size_where_ar_is_faster():
    ar = {1: {"seconds": 1.0}, 8: {"seconds": 0.3}, 64: {"seconds": 0.2}}
    assert crossover(ar, ar) == "-"
    assert crossover({1: {"seconds": 0.2}, 8: {"seconds": 0.35}, 64: {"seconds": 0.3}}, ar) == (
        "beats AR up to batch 1, not from 8"
    )
    assert crossover({1: {"seconds": 1.5}, 8: {"seconds": 0.5}}, ar) == "slower than AR from batch 1"
    assert crossover({1: {"seconds": 0.1}, 8: {"seconds": 0.1}, 64: {"seconds": 0.1}}, ar).startswith("beats AR at")
