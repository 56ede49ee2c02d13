"""ssd-bench gpu runs end to end with --tiny on the CPU (the same code paths as on a GPU, tiny models)."""

import json
import threading
import time
import traceback
import warnings

import pytest
import torch

from ssd_bench import gpu, gpu_report
from ssd_bench import main as run_bench
from ssd_pipelines.heads import VERTICAL_DRAFTERS


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One whole `ssd-bench gpu --tiny` run (about 80 s on a 2-core CPU, most of it section A): its folder and JSON."""
    out = tmp_path_factory.mktemp("gpu")
    gpu.main(["--tiny", "--out", str(out)])
    return out, json.loads((out / "gpu.json").read_text())


def test_every_section_runs_and_is_written(tiny_run):
    out, results = tiny_run
    assert {name: results[name]["status"] for name in "ABCDEF"} == dict.fromkeys("ABCDEF", "done")
    assert results["A"]["box"]["status"] == "done" and results["A"]["box"]["beside_abandoned"] == []
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


def test_the_janus_shape_runs_captured_first_and_times_each_decode_per_pass(tiny_run):
    """Each mode in a box of its own, captured first; each decode cut after its rows, per pass from its own stats,
    against the captured bare pass of its width."""
    _, results = tiny_run
    b = results["B"]
    assert b["grid"] == [4, 4] and b["rows"] == gpu.TINY_ROWS
    assert list(b["boxes"]) == ["build", "captured", "eager", "compiled"] == ["build", *b["modes"]]
    assert all(box["status"] == "done" and box["beside_abandoned"] == [] for box in b["boxes"].values())
    modes = b["modes"]
    assert {m: [d["decoding"] for d in modes[m]["decodings"]] for m in modes} == {
        m: list(plan.decodings) for m, plan in gpu.PLAN.items()
    }
    captured = modes["captured"]["bare_passes"]
    for m, res in modes.items():
        bare = res["bare_passes"]
        assert bare["ar_step_gb_per_s"] == pytest.approx(b["pass_bytes"] / bare["ar_step"] / 1e9)
        for d in res["decodings"]:
            assert d["rows"] == gpu.TINY_ROWS and d["mode"] == m
            assert d["seconds_per_pass"] == pytest.approx(d["seconds"] / d["passes"])
            assert d["gb_per_s"] == pytest.approx(b["pass_bytes"] * d["passes"] / d["seconds"] / 1e9)
            width = "ar_step" if d["decoding"] == "ar" else "row_pass"
            assert d["per_bare_pass"] == {
                "value": pytest.approx(d["seconds_per_pass"] / captured[width]),
                "numerator": f"{m} {d['decoding']}, a pass",
                "denominator": f"captured {gpu_report.WIDTHS[width]}",
            }
            if m == "eager":
                assert d["compiled_calls"] == 0 and "warmup" not in d
            else:  # compiled by its warm-up, every call compiled, nothing compiled again while timed
                assert d["compiled_calls"] > 0 and d["eager_calls"] == 0 and d["graphs_compiled"] == 0
                assert d["warmup"]["eager_calls"] == 0 and d["warnings"] == d["warmup"]["warnings"] == []
    passes = {(d["mode"], d["decoding"]): d["passes"] for res in modes.values() for d in res["decodings"]}
    assert passes["captured", "ar"] == 1 + 2 * 4 - 1  # the prefill, then a pass a cell up to the last of row 2
    # the same seeds through static (captured), dynamic (compiled) and eager passes: the same decodes
    assert {label: {passes[m, x] for m, x in passes if x == label} for label in gpu.JANUS_DECODINGS} == {
        label: {passes["eager", label]} for label in gpu.JANUS_DECODINGS
    }
    counted = {m: res["torch"] for m, res in modes.items()}
    assert counted["captured"]["stats"]["unique_graphs"] > 0 and counted["eager"]["stats"] == {}
    assert all(c["graph_break"] == {} and c["inductor"] == {} for c in counted.values())  # --tiny: no inductor
    assert list(modes["captured"]["drafters"]) == ["cell", "recurrent"]
    assert list(modes["eager"]["drafters"]) == list(VERTICAL_DRAFTERS)
    c = results["C"]
    assert c["bare_passes_of"] == "captured"
    assert [(p["source"], p["decoding"]) for p in c["projections"]] == [
        ("paper", "ssd r=1"),
        ("paper", "ssd r=2"),
        ("reference model", "ssd r=2"),
        ("reference model", "exact"),
    ]
    assert c["projections"][0]["ar_seconds"] == pytest.approx(captured["prefill"] + 16 * captured["ar_step"])
    reference = {
        r["decoding"]: r["passes"] for r in results["A"]["runs"] if r["dtype"] == "float32" and r["images"] == 1
    }
    assert c["projections"][2]["ssd_passes"] == round(reference["ssd r=2"] / reference["ar"] * 16)


def test_memory_syncs_and_targets_are_reported_and_not_judged_on_the_cpu(tiny_run):
    out, results = tiny_run
    assert set(results["D"]["peak_memory_gib"].values()) == {None}
    e = results["E"]
    assert e["rows"] == gpu.SYNC_ROWS and "host_syncs" not in results["B"]["modes"]["captured"]  # moved to E
    assert {m: list(counted) for m, counted in e["modes"].items()} == {
        m: list(plan.decodings) for m, plan in gpu.PLAN.items()
    }
    for counted in e["modes"].values():
        for s in counted.values():
            assert type(s["host_syncs"]) is int and s["per_pass"] == pytest.approx(s["host_syncs"] / s["passes"])
            assert sum(s["kinds"].values()) == s["host_syncs"] and s["sync_warnings"] is None
    # counted where the captured passes ran (the owner's thread): exact's reads of its frontier are there
    assert e["modes"]["captured"]["exact, cell"]["kinds"]["tolist"] > 0
    rows = results["F"]["rows"]
    decodings = sum(len(plan.decodings) for plan in gpu.PLAN.values())
    # each decoding's cost per pass; the 1-token pass; ar's seconds per mode; the projection, the drafter, the
    # reference model's two
    assert len(rows) == decodings + 1 + len(gpu.PLAN) + 4
    assert {r["met"] for r in rows} == {"n/a (CPU)"} and all(r["value"] is not None for r in rows)
    assert rows[0]["target"] == "7B: ar (captured), a pass / the captured 1-token pass"
    doc = (out / "gpu.md").read_text()
    assert "| captured | ar | 2 | 8 |" in doc and "(captured ar, a pass / captured 1-token pass)" in doc
    counted = e["modes"]["captured"]["exact, cell"]
    assert f"| captured | exact, cell | {counted['passes']} | {counted['per_pass']:.2f} |" in doc  # E's table


def test_a_section_that_raises_is_recorded_and_the_others_still_run(tmp_path, monkeypatch):
    def no_model(*args, **kwargs):
        raise RuntimeError("no reference model here")

    monkeypatch.setattr(gpu.SSDAutoregressivePipeline, "from_pretrained", no_model)
    monkeypatch.setattr(gpu, "PLAN", {m: gpu.ModePlan(("ar",), (), plan.seconds) for m, plan in gpu.PLAN.items()})
    gpu.main(["--tiny", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "gpu.json").read_text())
    assert results["A"]["status"] == "error: RuntimeError('no reference model here')"
    assert results["A"]["box"]["status"] == results["A"]["status"]
    assert [results[name]["status"] for name in "BCE"] == ["done"] * 3
    assert [p["source"] for p in results["C"]["projections"]] == ["paper", "paper"]
    assert [r["measured"] for r in results["F"]["rows"][-2:]] == ["not measured"] * 2
    assert "**error: RuntimeError('no reference model here')**" in (tmp_path / "gpu.md").read_text()


def test_a_measurement_that_outruns_its_box_is_abandoned_and_the_boxes_after_it_still_run(tmp_path, monkeypatch):
    """A captured box of a few milliseconds, whose bare passes take a second before they even trace: it is reported
    abandoned, in gpu.json and gpu.md; the compiled and eager boxes run after it, the first beside it; and what its
    worker measures once it wakes is dropped."""
    measure = gpu.bs.measure

    def slow_measure(*args, **kwargs):
        time.sleep(1)
        return measure(*args, **kwargs)

    monkeypatch.setattr(gpu.bs, "measure", slow_measure)
    plans = {"captured": gpu.ModePlan(("ar",), (), 0.002), "compiled": gpu.ModePlan(("ar",), (), 200)}
    monkeypatch.setattr(gpu, "PLAN", {**plans, "eager": gpu.ModePlan(("ar",), (), 200)})
    gpu.main(["--tiny", "--sections", "BC", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "gpu.json").read_text())
    b = results["B"]
    abandoned = b["boxes"]["captured"]["status"]
    assert abandoned.startswith("abandoned at the end of its 0.0 s, in B captured")
    assert b["status"] == f"captured: {abandoned}"
    assert [b["boxes"][m]["status"] for m in ("build", "compiled", "eager")] == ["done"] * 3
    assert b["boxes"]["compiled"]["beside_abandoned"] == ["B captured"]  # asleep when the compiled box began
    assert "decodings" not in b["modes"].get("captured", {})
    assert [d["mode"] for m in b["modes"].values() for d in m["decodings"]] == ["compiled", "eager"]
    assert b["modes"]["eager"]["decodings"][0]["per_bare_pass"]["denominator"] == "compiled 1-token pass"
    assert results["C"]["status"] == "done" and results["C"]["bare_passes_of"] == "compiled"
    assert f"**{abandoned}**" in (tmp_path / "gpu.md").read_text()
    for worker in [t for t in threading.enumerate() if t.name == "ssd-bench B captured"]:
        worker.join(timeout=60)  # it wakes, measures, and stops at its next check
    assert json.loads((tmp_path / "gpu.json").read_text()) == results


def test_a_section_out_of_time_is_abandoned_and_what_needs_it_is_not_run(tmp_path):
    gpu.main(["--tiny", "--sections", "B", "--deadline", "0", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "gpu.json").read_text())
    assert results["B"]["boxes"]["build"]["status"].startswith("abandoned at the end of its 0.0 s, in B build")
    assert [results["B"]["boxes"][m]["status"] for m in gpu.PLAN] == ["not run: the 7B shape was not built"] * 3
    assert results["A"]["status"] == results["E"]["status"] == "not run"


def test_inductor_compiles_the_captured_passes_on_the_cpu(tmp_path, monkeypatch):
    """--tiny traces with the eager backend; here inductor compiles the captured mode's static passes for real
    (no CUDA graphs on a CPU), one decoding, two rows: every call runs compiled, none eagerly."""
    monkeypatch.setattr(gpu, "TINY_BACKEND", "inductor")
    monkeypatch.setattr(gpu, "PLAN", {"captured": gpu.ModePlan(("ar",), (), 500)})
    gpu.main(["--tiny", "--sections", "BE", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "gpu.json").read_text())
    captured = results["B"]["modes"]["captured"]
    assert results["B"]["boxes"]["captured"]["status"] == "done"
    assert captured["options"] == {"dynamic": False, "backend": "inductor"}
    (ar,) = captured["decodings"]
    assert ar["compiled_calls"] == ar["passes"] - 1 and ar["eager_calls"] == 0 and ar["warnings"] == []
    assert ar["warmup"]["eager_calls"] == 0 and ar["graphs_compiled"] == 0  # the bare passes compiled its width
    counted = captured["torch"]
    assert counted["stats"]["unique_graphs"] >= 2 and counted["graph_break"] == {}  # the 1-token and the row pass
    inductor = counted["inductor"]
    assert inductor.get("fxgraph_cache_miss", 0) + inductor.get("fxgraph_cache_hit", 0) >= 2  # inductor compiled
    assert inductor.get("cudagraph_skips", 0) == 0  # none asked for on a CPU
    syncs = results["E"]["modes"]["captured"]["ar"]
    assert syncs["passes"] == ar["passes"] and type(syncs["host_syncs"]) is int


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

    assert GPU_SECTIONS == "".join(gpu.MEASURES)


def test_the_default_boxes_and_their_reserve_fill_nine_minutes_and_scale_to_the_deadline():
    boxes = gpu.box_seconds("ABCE")
    assert list(boxes) == ["A", "B build", "B captured", "B eager", "B compiled"]
    assert sum(boxes.values()) + gpu.RESERVE == 540 == gpu.commands.gpu_parser().parse_args([]).deadline
    assert gpu.box_lengths(boxes, 270) == pytest.approx({label: seconds / 2 for label, seconds in boxes.items()})
    assert gpu.box_lengths({"Q": gpu.BOXES["Q"]}, 540)["Q"] == pytest.approx(
        540 - 540 * gpu.RESERVE / (gpu.BOXES["Q"] + gpu.RESERVE)
    )
