"""ssd-bench quantization --tiny runs end to end on the CPU: each model in float32, int8 and nf4, its backbone's bytes
as stored, `exact` lossless on every backbone that runs, a precision that cannot run named with its reason, and the
published checkpoints projected."""

import importlib.util
import json

import pytest
import torch

from ssd_bench import quantization, quantization_report
from ssd_pipelines.hub import default_model

MODELS = ["reference", "Janus-Pro (tiny)", "Emu3 (tiny)", "Lumina-mGPT (tiny)"]
PRECISIONS = ["float32", "int8", "nf4"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One whole `ssd-bench quantization --tiny` run (about 25 s on a 2-core CPU): the markdown's path, the JSON's
    rows by (model, precision), and the JSON."""
    out = tmp_path_factory.mktemp("quantization") / "quantization.md"
    quantization.main(["--tiny", "--out", str(out)])
    results = json.loads(out.with_suffix(".json").read_text())
    return out, {(r["model"], r["precision"]): r for r in results["rows"]}, results


def test_the_table_its_json_and_its_plot_are_written(tiny_run):
    out, rows, results = tiny_run
    assert list(rows) == [(model, precision) for model in MODELS for precision in PRECISIONS]
    doc = out.read_text()
    assert doc.startswith("# Quantized backbones") and f"Made by `ssd-bench quantization --tiny --out {out}`" in doc
    assert "cores, no GPU" in doc and "CPU timings are noisy" in doc and "A projection, not a measurement" in doc
    assert "![backbone bytes" in doc and f"]({out.with_suffix('.png').name})" in doc
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert results["environment"]["repeats"] == 1


def test_int8_stores_the_backbone_in_its_real_bytes(tiny_run):
    _, rows, _ = tiny_run
    float32, int8 = rows["reference", "float32"]["weights"], rows["reference", "int8"]["weights"]
    assert float32["bytes"] == 4 * float32["parameters"] and float32["quantized"] is None
    assert int8["bytes"] < 0.4 * float32["bytes"]  # numel * element_size of torchao's weights would say 1.0x
    quantized = int8["quantized"]
    assert quantized["code_bytes"] == quantized["weights"] and quantized["block"] == "row"  # a byte a weight
    assert quantized["block_bytes"] == 5 * quantized["blocks"]  # a float32 scale and an int8 zero point a row
    emu3 = rows["Emu3 (tiny)", "nf4"]["weights"]["quantized"]
    assert 2 * emu3["code_bytes"] == emu3["weights"] and emu3["block"] == 64  # two weights a byte, absmax per 64


def test_every_row_that_ran_is_lossless_in_no_more_passes_than_ar(tiny_run):
    _, rows, _ = tiny_run
    ran = {key: r for key, r in rows.items() if r["status"] == "ran"}
    assert {"reference", "Emu3 (tiny)", "Lumina-mGPT (tiny)"} <= {model for model, _ in ran}
    for (model, precision), r in ran.items():
        ar, exact = r["decodings"]["ar"], r["decodings"]["exact"]
        assert ar["passes"] == r["grid"][0] * r["grid"][1], (model, precision)  # one pass a code
        assert 0 < exact["passes"] <= ar["passes"], (model, precision)
        # half precision rounds a one-token pass and a wide one differently (docs/decoding.md, "In floating point")
        assert r["greedy_exact_equals_ar"] or quantization_report.half_precision(precision, "cpu"), (model, precision)
        assert ar["seconds_per_image"] > 0 and exact["seconds_per_image"] > 0
    for precision in ("float32", "int8"):
        reference = ran["reference", precision]["decodings"]
        assert reference["exact"]["passes"] < reference["ar"]["passes"] / 2  # trained heads


def test_a_precision_that_cannot_run_says_why(monkeypatch):
    """A row that cannot load is kept in the table with the library's reason, and the run goes on."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    reference = quantization.Model("reference", str(default_model()), "a red circle")
    row = quantization.measure_row(reference, "int8", torch.device("cpu"), repeats=1)
    assert row["status"] == "refused" and "weights" not in row
    assert row["reason"] == (
        "dtype int8 quantizes the backbone with torchao, which is not installed: pip install 'torchao>=0.18' (or "
        "'ssd-pipelines[quantization]'), or choose float32, float16, bfloat16"
    )
    assert quantization_report.row_line(row, None).startswith(f"| reference | int8 | **refused**: {row['reason']} |")


def test_each_published_checkpoint_is_projected_in_each_precision(tiny_run):
    _, _, results = tiny_run
    projected = {(p["checkpoint"], p["precision"]): p for p in results["projections"]}
    checkpoints = ["Janus-Pro-7B", "Emu3-Gen", "Lumina-mGPT-7B-768"]
    assert list(projected) == [(c, p) for c in checkpoints for p in PRECISIONS]
    for checkpoint in checkpoints:
        float32, int8 = projected[checkpoint, "float32"], projected[checkpoint, "int8"]
        assert float32["gib"] == pytest.approx(4 * float32["parameters"] / 2**30)
        assert 6e9 < float32["parameters"] < 1e10 and float32["quantized_weights"] == 0
        assert 0.7 < int8["quantized_weights"] / int8["parameters"] < 1  # the linear layers but the output head
        assert int8["gib"] < 0.35 * float32["gib"]
        nf4 = projected[checkpoint, "nf4"]
        assert nf4["gib"] is None or nf4["gib"] < int8["gib"]
        for p in (float32, int8):
            assert [p["fits_8gib"], p["fits_12gib"]] == [p["gib"] <= 8, p["gib"] <= 12]
