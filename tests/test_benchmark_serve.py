"""`ssd-bench serve` (ssd_bench/serve.py): its percentiles, table and targets on synthetic timings, its figure, and
one tiny real run on the session's local Ray (a tiny pipeline, one load level, two requests)."""

from __future__ import annotations

import numpy as np
import pytest

from ssd_bench import BENCHMARKS
from ssd_bench import serve as bench
from ssd_pipelines.testing import tiny_pipeline


def test_percentile_matches_numpys_linear_interpolation():
    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 16):
        values = list(rng.random(n))
        for q in (0, 50, 95, 100):
            assert bench.percentile(values, q) == pytest.approx(np.percentile(values, q))
    assert bench.percentile([], 50) != bench.percentile([], 50)  # nan


def synthetic_rows() -> list[dict]:
    """ar: 1 s a request alone, batching well; exact: 0.6 s alone, batching worse; auto: the better of the two."""
    rows = []
    for clients in (1, 4):
        for decoding, alone, batched in (("ar", 1.0, 0.3), ("exact", 0.6, 0.5), ("auto", 0.6, 0.31)):
            seconds = alone if clients == 1 else batched * clients
            level = bench.Level(1, decoding, clients, wall_s=8 * seconds / clients)
            level.latencies = [seconds * (1 + 0.01 * i) for i in range(8)]
            level.call_images = [clients] * 8
            level.chosen = ["exact" if decoding == "exact" or (decoding == "auto" and clients == 1) else "ar"] * 8
            level.exact_max_batch = {3}
            rows.append(bench.summarize(level))
    return rows


def test_table_and_targets_from_synthetic_timings():
    rows = synthetic_rows()
    auto_1 = next(r for r in rows if r["decoding"] == "auto" and r["clients"] == 1)
    assert auto_1["throughput"] == pytest.approx(8 / 4.8) and auto_1["exact_share"] == 1.0
    assert auto_1["p50"] == pytest.approx(0.6 * 1.035) and auto_1["requests"] == 8
    lines = bench.table(rows)
    assert lines[0].startswith("| replicas | decoding | clients") and len(lines) == 2 + len(rows)
    assert "| 1 | auto | 4 | 8 | 3.23 |" in "\n".join(lines)
    said, met = bench.targets(rows)
    assert met, said
    assert "at least 0.97x the better" in said[0] and "lowest at 4 clients" in said[0] and said[0].endswith("met.")
    assert "1.67x better" in said[1]
    slow = [dict(r, throughput=r["throughput"] * 0.5) if r["decoding"] == "auto" else r for r in rows]
    said, met = bench.targets(slow)
    assert not met and said[0].endswith("missed.")


def test_the_figure_is_drawn(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "serving_benchmark.png"
    bench.plot(synthetic_rows(), out)
    assert out.read_bytes().startswith(b"\x89PNG")


def test_it_is_an_ssd_bench_subcommand():
    assert "serve" in BENCHMARKS


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-serve")
    tiny_pipeline().save_pretrained(folder)
    return str(folder)


def test_a_tiny_real_run_on_the_session_ray(ray_cluster, tiny_model):
    rows, servers = bench.run(
        tiny_model,
        replicas=(1,),
        clients=(2,),
        decodings=("auto",),
        requests=2,
        exact_max_batch="measure",
        timeout=60,
        progress=False,
    )
    (row,) = rows
    assert row["requests"] == 2 and row["errors"] == 0 and row["throughput"] > 0 and row["p50"] > 0
    info = servers[1]["info"]
    assert info["exact_max_batch_source"] == "measured at start-up" and 0 <= info["exact_max_batch"] <= 8
    assert servers[1]["exact_max_batch"] == [info["exact_max_batch"]]  # what the answers' stats said
    assert set(info["crossover"]["seconds_per_image"]) >= {"1"}  # JSON keys
