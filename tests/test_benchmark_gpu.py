"""ssd-bench gpu runs end to end with --tiny on the CPU (the same code paths as on a GPU, tiny models)."""

import json
import traceback
import warnings

import pytest
import torch

from ssd_bench import gpu, gpu_report
from ssd_bench import main as run_bench
from ssd_pipelines.heads import VERTICAL_DRAFTERS


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One whole `ssd-bench gpu --tiny` run (about 30 s on a 2-core CPU): its folder and its JSON."""
    out = tmp_path_factory.mktemp("gpu")
    gpu.main(["--tiny", "--out", str(out)])
    return out, json.loads((out / "gpu.json").read_text())


def test_every_section_runs_and_is_written(tiny_run):
    out, results = tiny_run
    assert {name: results[name]["status"] for name in "ABCDEF"} == dict.fromkeys("ABCDEF", "done")
    doc = (out / "gpu.md").read_text()
    assert doc.startswith("# GPU measurement") and f"Made by `ssd-bench gpu --tiny --out {out}`" in doc
    assert "no GPU was available" in doc and "pip install -e . && ssd-bench gpu" in doc
    assert all(f"## {name}. " in doc for name in "ABCDEF")
    assert {"torch", "transformers", "diffusers", "device"} <= results["environment"].keys()


def test_the_reference_model_agrees_greedily_and_counts_whole_passes(tiny_run):
    _, results = tiny_run
    a = results["A"]
    assert a["greedy_float32"] == {"images": 2, "exact_equals_ar": True, "ssd_no_cap_equals_ar": True}
    runs = {(r["dtype"], r["decoding"], r["images"]): r for r in a["runs"]}
    assert len(runs) == 2 * 4 * 2  # dtypes x decodings x (1, 2) images
    assert all(type(r["passes"]) is int and r["seconds_per_image"] > 0 for r in runs.values())
    assert runs["float32", "ar", 1]["passes"] == 256  # one pass per code of the 16 x 16 grid
    assert runs["float32", "ssd r=1", 1]["passes"] < runs["float32", "ssd r=2", 1]["passes"] < 256


def test_the_janus_shape_times_passes_drafters_and_decodings(tiny_run):
    _, results = tiny_run
    b = results["B"]
    assert b["grid"] == [4, 4] and set(b["bare_passes"]) == {"prefill", "ar_step", "row_pass", "heads", "pass_bytes"}
    assert list(b["drafters"]) == list(VERTICAL_DRAFTERS)
    assert [(r["mode"], r["decoding"]) for r in b["decodings"]] == [
        (m, d) for m in gpu.MODES for d in gpu.JANUS_DECODINGS
    ]
    by_mode = {m: [r["passes"] for r in b["decodings"] if r["mode"] == m] for m in gpu.MODES}
    # the same seeds through compiled, and static (captured) passes and steps: the same decodes
    assert by_mode["compiled"] == by_mode["eager"] == by_mode["captured"]
    assert b["cudagraph_skips"] == 0  # --tiny traces with the eager backend: nothing asked to be captured
    assert all(d["seconds_per_row"] > 0 and d["seconds_per_row_compiled"] > 0 for d in b["drafters"].values())
    assert all(type(r["passes"]) is int for r in b["decodings"])
    ar = b["decodings"][0]
    assert ar["passes"] == 16 and ar["per_bare_pass"] == pytest.approx(ar["seconds"] / 16 / b["bare_passes"]["ar_step"])
    c = results["C"]["projections"]
    assert [(p["source"], p["decoding"]) for p in c] == [
        ("paper", "ssd r=1"),
        ("paper", "ssd r=2"),
        ("reference model", "ssd r=2"),
        ("reference model", "exact"),
    ]
    reference = {
        r["decoding"]: r["passes"] for r in results["A"]["runs"] if r["dtype"] == "float32" and r["images"] == 1
    }
    assert c[2]["ssd_passes"] == round(reference["ssd r=2"] / reference["ar"] * 16)  # its share of AR's, on 16 cells


def test_memory_syncs_and_targets_are_reported_and_not_judged_on_the_cpu(tiny_run):
    _, results = tiny_run
    assert set(results["D"]["peak_memory_gib"].values()) == {None}
    syncs = results["E"]["decodings"]
    assert list(syncs) == list(gpu.JANUS_DECODINGS)
    assert all(type(s["host_syncs"]) is int and s["sync_warnings"] is None for s in syncs.values())
    rows = results["F"]["rows"]
    # per mode: each decoding's cost per pass and ar's seconds; then the pass, the projection, the drafter, the
    # reference model's two
    assert len(rows) == len(gpu.MODES) * (len(gpu.JANUS_DECODINGS) + 1) + 5
    assert {r["met"] for r in rows} == {"n/a (CPU)"} and all(r["value"] is not None for r in rows)


def test_a_section_that_raises_is_recorded_and_the_others_still_run(tmp_path, monkeypatch):
    def no_model(*args, **kwargs):
        raise RuntimeError("no reference model here")

    monkeypatch.setattr(gpu.SSDAutoregressivePipeline, "from_pretrained", no_model)
    gpu.main(["--tiny", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "gpu.json").read_text())
    assert results["A"]["status"] == "error: RuntimeError('no reference model here')"
    assert [results[name]["status"] for name in "BCE"] == ["done"] * 3
    assert [p["source"] for p in results["C"]["projections"]] == ["paper", "paper"]
    assert [r["measured"] for r in results["F"]["rows"][-2:]] == ["not measured"] * 2
    assert "**error: RuntimeError('no reference model here')**" in (tmp_path / "gpu.md").read_text()


def test_a_section_out_of_time_says_before_what(tmp_path):
    gpu.main(["--tiny", "--sections", "B", "--deadline", "0", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "gpu.json").read_text())
    assert results["B"]["status"] == "out of time before building the Janus-Pro-7B shape"
    assert results["A"]["status"] == results["E"]["status"] == "not run"


def test_the_quantized_7b_shape_is_asked_for_and_measured_in_each_precision(tiny_run, tmp_path):
    """Q (issue 41) is not a default section; asked for, it builds the shape in float32 (bfloat16 on a GPU), int8
    and nf4 and times the same passes as B."""
    assert tiny_run[1]["Q"]["status"] == "not run"
    gpu.main(["--tiny", "--sections", "Q", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "gpu.json").read_text())
    rows = {r["precision"]: r for r in results["Q"]["rows"]}
    assert results["Q"]["status"] == "done" and list(rows) == ["float32", "int8", "nf4"]
    assert all(
        r["status"] == "ran" and r["seconds"]["ar_step"] > 0 and r["seconds"]["row_pass"] > 0 for r in rows.values()
    )
    assert rows["nf4"]["weight_bytes"] < rows["int8"]["weight_bytes"] < rows["float32"]["weight_bytes"]
    assert "peak_gib" not in rows["int8"]  # CUDA only
    assert "| int8 | " in (tmp_path / "gpu.md").read_text()


def test_a_quantized_precision_this_machine_cannot_run_is_refused_with_its_reason(monkeypatch):
    from ssd_bench import gpu_quantized

    def refuse(precision, device_type):
        raise ValueError("no torchao")

    monkeypatch.setattr(gpu_quantized, "check_precision", refuse)
    row = gpu_quantized.measure_precision("int8", torch.device("cpu"), tiny=True, prompt_tokens=8, repeats=1)
    assert row == {"precision": "int8", "status": "refused", "reason": "no torchao"}
    assert "| int8 | **refused**: no torchao |" in "\n".join(gpu_report.quantized_lines({"rows": [row]}))


def test_targets_are_judged_on_a_gpu_only():
    at_most, below = gpu_report.Target("t", 1.0, "{:.1f}"), gpu_report.Target("t", 1.0, "{:.1f}", strictly=True)
    assert [at_most.row(1.0, True)["met"], below.row(1.0, True)["met"], below.row(0.9, True)["met"]] == [
        True,
        False,
        True,
    ]
    assert at_most.row(2.0, False)["met"] == "n/a (CPU)" and at_most.row(None, True)["met"] is None


def test_a_sync_is_placed_at_the_innermost_frame_of_the_package_outside_its_testing_surface():
    stack = [
        traceback.FrameSummary(gpu.__file__, 1, "decode"),  # ssd_bench, beside the package
        traceback.FrameSummary(str(gpu.PACKAGE / "decoding" / "frontier.py"), 7, "_advance"),
        traceback.FrameSummary(str(gpu.PACKAGE / "testing" / "host_syncs.py"), 3, "counted"),
        traceback.FrameSummary("/site-packages/torch/_tensor.py", 9, "__bool__"),
    ]
    assert gpu.sync_site(stack, "message") == "ssd_pipelines/decoding/frontier.py:7"
    assert gpu.sync_site(stack[:1], "message") == "message"


def test_warning_sites_keep_the_matching_warnings_and_let_others_through():
    def two_syncs_and_another_warning():
        for _ in range(2):
            warnings.warn("called a synchronizing CUDA operation")
        warnings.warn("unrelated")

    with pytest.warns(UserWarning, match="unrelated"), gpu.warning_sites("synchronizing") as sites:
        two_syncs_and_another_warning()
    assert sites == ["called a synchronizing CUDA operation"] * 2  # a test's stack has no frame of the package


def test_ssd_bench_lists_gpu():
    with pytest.raises(SystemExit, match=r"\n  gpu "):
        run_bench([])


def test_the_sections_declared_for_the_command_line_are_the_ones_it_runs():
    from ssd_bench.commands import GPU_SECTIONS

    assert "".join(gpu.SHARES) == GPU_SECTIONS == "".join(gpu.MEASURES)
