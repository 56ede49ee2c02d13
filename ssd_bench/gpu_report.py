"""`ssd-bench gpu`'s report: issue 39's targets judged against what ran, and gpu.md written from gpu.json's figures.

Apart from the measuring (gpu.py), so that a report can be rewritten, or a target changed, from a gpu.json without a
GPU: everything here reads the results dictionary alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import backbone_speed as bs
from .gpu_quantized import CARDS_GIB

TITLE = "GPU measurement: the reference model and Janus-Pro-7B's shape"
SECTIONS = {
    "A": "The reference model on the device",
    "B": "Janus-Pro-7B's shape",
    "C": "Projections",
    "D": "Peak memory",
    "E": "Host syncs",
    "F": "Targets (issue 39)",
    "Q": "Janus-Pro-7B's shape quantized (issue 41)",
}


@dataclass(frozen=True)
class Target:
    """One of issue 39's targets: met when the measured value is at most `bound` (below it where `strictly`)."""

    what: str
    bound: float
    fmt: str
    strictly: bool = False

    def row(self, value: float | None, on_gpu: bool) -> dict:
        if value is None:
            met = None
        elif not on_gpu:
            met = "n/a (CPU)"
        else:
            met = value < self.bound if self.strictly else value <= self.bound
        measured = "not measured" if value is None else self.fmt.format(value)
        return {"target": self.what, "bound": self.bound, "value": value, "measured": measured, "met": met}


PREFERRED = ("captured", "compiled", "eager")  # the order ratios and projections take their bare passes in
WIDTHS = {"ar_step": "1-token pass", "row_pass": "row pass"}


def first_measured(modes: dict, key: str) -> tuple[str, dict] | tuple[None, None]:
    """(mode, figures) of the first mode, captured first (the pass that matters on a GPU), that measured `key`."""
    for mode in PREFERRED:
        if modes.get(mode, {}).get(key):
            return mode, modes[mode][key]
    return None, None


def per_bare_pass(decoding: dict, modes: dict) -> dict | None:
    """A decoding's seconds a pass against the bare pass of its width (`ar`: 1 token; `ssd`, `exact`: a row) of the
    first mode that measured one, captured first, both modes named."""
    mode, bare = first_measured(modes, "bare_passes")
    if mode is None:
        return None
    width = "ar_step" if decoding["decoding"] == "ar" else "row_pass"
    return {
        "value": decoding["seconds_per_pass"] / bare[width],
        "numerator": f"{decoding['mode']} {decoding['decoding']}, a pass",
        "denominator": f"{mode} {WIDTHS[width]}",
    }


def recurrent_share(modes: dict) -> tuple[str, float | None]:
    """(mode, share): the recurrent drafter's row against the row pass of the first mode, captured first, that timed
    both."""
    for mode in PREFERRED:
        m = modes.get(mode, {})
        if "recurrent" in m.get("drafters", {}) and m.get("bare_passes"):
            return mode, m["drafters"]["recurrent"]["seconds_per_row"] / m["bare_passes"]["row_pass"]
    return "captured", None


def targets(results: dict, on_gpu: bool) -> list[dict]:
    """F: issue 39's targets against what ran; judged on a GPU only."""
    janus, projections = results["B"], results["C"].get("projections", [])
    modes = janus.get("modes", {})
    decodings = [d for m in modes.values() for d in m.get("decodings", [])]
    reference = {(r["dtype"], r["decoding"], r["images"]): r for r in results["A"].get("runs", [])}
    rows = []
    for d in decodings:
        ratio = d.get("per_bare_pass")
        what = f"7B: {d['decoding']} ({d['mode']}), a pass / the {ratio['denominator'] if ratio else 'bare pass'}"
        rows.append(Target(what, 1.25, "{:.2f}x").row(ratio and ratio["value"], on_gpu))
    mode, bare = first_measured(modes, "bare_passes")
    ar_step = bare and 1e3 * bare["ar_step"]
    rows.append(
        Target(f"7B: the 1-token pass ({mode or 'captured'}), 1 image (ms)", 8.5, "{:.2f} ms").row(ar_step, on_gpu)
    )
    cells = janus["grid"][0] * janus["grid"][1] if "grid" in janus else None
    for d in decodings:
        if d["decoding"] == "ar":
            what = f"7B: ar ({d['mode']}), one image (s): its seconds a pass x {cells} cells"
            rows.append(Target(what, 6.0, "{:.2f} s").row(d["seconds_per_pass"] * cells, on_gpu))
    r2 = next((p for p in projections if (p["source"], p["decoding"]) == ("paper", "ssd r=2")), None)
    what = (
        f"7B: ssd r=2 projected at {r2['ssd_passes'] if r2 else 80} passes (the paper's 80 on 24 x 24), one image (s)"
    )
    rows.append(Target(what, 1.4, "{:.2f} s").row(r2 and r2["ssd_seconds"], on_gpu))
    mode, share = recurrent_share(modes)
    rows.append(Target(f"7B: the recurrent drafter's row / a row pass ({mode})", 0.25, "{:.0%}").row(share, on_gpu))
    ar = reference.get(("float32", "ar", 1))
    rows.append(
        Target("reference fp32: ar, ms a pass, 1 image", 1.5, "{:.2f} ms").row(ar and ar["ms_per_pass"], on_gpu)
    )
    exact, ar16 = reference.get(("bfloat16", "exact", 1)), reference.get(("bfloat16", "ar", 1))
    ratio = exact["seconds_per_image"] / ar16["seconds_per_image"] if exact and ar16 else None
    rows.append(
        Target("reference bf16: exact's seconds / ar's, 1 image (faster: < 1)", 1.0, "{:.2f}", True).row(ratio, on_gpu)
    )
    return rows


GPU_HOWTO = [
    "To measure on a GPU (about 9 minutes on an H200, with some 30 GiB of its memory), from a checkout of this",
    "repository:",
    "",
    "```bash",
    "pip install -e . && ssd-bench gpu     # writes docs/gpu.md and docs/gpu.json; --out DIR writes them elsewhere",
    "pip install -e '.[quantization]' && ssd-bench gpu --sections Q --out docs/gpu_quantized  # the 7B shape in int8, nf4",
    "```",
    "",
    "A GPU machine without internet access needs the wheels of what this package requires and it lacks, built for",
    "its Python and platform (often transformers >= 5.24, diffusers >= 0.42 and huggingface_hub >= 1.0, with those",
    "of their dependencies it lacks): carry them over, install them with",
    "`pip install --no-index --no-deps --target /tmp/site wheels/*.whl` and put /tmp/site first on `PYTHONPATH`.",
    "Check the imports beforehand in a virtual environment holding only the GPU machine's own packages.",
]


def cpu_note() -> list[str]:
    """What a CPU run's figures are, and which targets await a GPU."""
    return [
        "**These are CPU figures on tiny models, not GPU ones: no GPU was available where this file was made.**",
        "`--tiny` ran every section's code on the CPU: the Janus-Pro-7B shape shrunk to a tiny model in float32,",
        "its `captured` and `compiled` modes traced by torch.compile's `eager` backend (no CUDA graphs, no",
        "inductor: the path, not the speed; tests/test_benchmark_gpu.py compiles the captured passes with",
        "inductor), the reference model with one timed repeat and 2 images for 16. They",
        "check that the code paths run, the time boxes hold and greedy decodings agree; their seconds say nothing",
        'of a GPU. Every target awaits a GPU ("n/a (CPU)" below): the 7B shape\'s cost per pass against the',
        "captured bare pass, its 1-token pass, `ar`'s seconds and projected `ssd` r=2's for one image, the",
        "recurrent drafter's share of a row pass, the reference model's milliseconds a pass for `ar` and bf16",
        "`exact` against bf16 `ar`.",
        "",
        *GPU_HOWTO,
        "",
    ]


def heading(name: str, res: dict) -> list[str]:
    status = "" if res["status"] == "done" else f"\n\n**{res['status']}**"
    return [f"## {name}. {SECTIONS[name]}{status}", ""]


def reference_lines(res: dict, batches: tuple[int, int]) -> list[str]:
    lines = [
        'The shipped reference model, `output_type="latent"` (the VQ decoder is not timed), its default guidance,',
        f"one prompt, median seconds after a warm-up, batches of {batches[0]} and {batches[1]} images.",
        "",
    ]
    greedy = res.get("greedy_float32")
    if greedy:
        verdicts = {key: f"**{str(greedy[key]).lower()}**" for key in ("exact_equals_ar", "ssd_no_cap_equals_ar")}
        lines += [
            f"Greedy check (temperature 0, float32, {greedy['images']} images): `exact` == `ar`: "
            + f"{verdicts['exact_equals_ar']}; `ssd` with no cap on rounds == `ar`: {verdicts['ssd_no_cap_equals_ar']}.",
            "Not checked in bf16, whose rounding may flip near-ties between a 1-token pass and a row pass.",
            "",
        ]
    if res.get("runs"):
        lines += ["| dtype | decoding | images | passes | seconds / image | ms / pass |", "|---|---|---|---|---|---|"]
        lines += [
            f"| {r['dtype']} | {r['decoding']} | {r['images']} | {r['passes']} | {r['seconds_per_image']:.4f} | "
            f"{r['ms_per_pass']:.2f} |"
            for r in res["runs"]
        ]
        lines.append("")
    return lines


def janus_lines(res: dict, dtype: str, tiny: bool) -> list[str]:
    if "grid" not in res:
        return box_lines(res)
    rows, cols = res["grid"]
    lines = [
        f"`JanusForConditionalGeneration` of Janus-Pro-7B's shape ({res['backbone_parameters']:,} parameters,",
        f"{rows} x {cols} grid), random {dtype} weights (built in {res['build_seconds']} s; a 1-token pass reads",
        f"{res['pass_bytes'] / 1e9:.3g} GB of them: the language model's layers and the image head), guidance",
        f"batched (2 rows an image), one image, a {bs.PROMPT_TOKENS}-token prompt. Random weights make acceptance",
        "meaningless: compare seconds per pass, not passes.",
        "",
        "Modes, in the order they ran, each in a time box of its own: `captured` (the passes and the engines' steps",
        "through `torch.compile` with static shapes, replayed as CUDA graphs:",
        '`pipe.enable_compiled_passes(mode="reduce-overhead")`), `eager`, then `compiled` (dynamic shapes,',
        "`pipe.enable_compiled_passes()`), last, so that a compile that runs out of time runs beside no timing.",
        *(["With `--tiny` both compiled modes are traced by the `eager` backend."] if tiny else []),
        "",
        *box_lines(res),
    ]
    modes = res.get("modes", {})
    return lines + bare_pass_lines(modes, cols) + decoding_lines(modes, res["rows"]) + drafter_lines(modes)


def box_lines(res: dict) -> list[str]:
    """B's time boxes: when each had to end, what it took, and how it ended."""
    if not res.get("boxes"):
        return []
    lines = [
        "Time boxes (`ssd_bench/gpu.py`): each has its seconds; one that ran out says what it abandoned, and the",
        "boxes after it still ran.",
        "",
        "| box | allowed (s) | took (s) | status | began beside abandoned work |",
        "|---|---|---|---|---|",
    ]
    for label, box in res["boxes"].items():
        status = box["status"] if box["status"] == "done" else f"**{box['status']}**"
        beside = ", ".join(box.get("beside_abandoned", [])) or "-"
        lines.append(
            f"| {label} | {box.get('allowed_seconds', '-')} | {box.get('seconds', '-')} | {status} | {beside} |"
        )
    return [*lines, ""]


def bare_pass_lines(modes: dict, cols: int) -> list[str]:
    measured = {mode: m["bare_passes"] for mode, m in modes.items() if m.get("bare_passes")}
    if not measured:
        return []
    lines = [
        "Bare passes (`backbone_speed.measure`: medians, the cache holding the prompt and half the image) in each",
        "mode, and the bandwidth each achieves: the weights' bytes over its seconds, as gpt-fast prints it.",
        "",
        f"| mode | prefill ms | 1 token ms | one row ({cols} tokens) ms | per-cell heads ms | 1 token GB/s | row GB/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode, b in measured.items():
        lines.append(
            f"| {mode} | {1e3 * b['prefill']:.2f} | {1e3 * b['ar_step']:.2f} | {1e3 * b['row_pass']:.2f} | "
            f"{1e3 * b['heads']:.2f} | {b['ar_step_gb_per_s']:.3g} | {b['row_pass_gb_per_s']:.3g} |"
        )
    return [*lines, ""]


def decoding_lines(modes: dict, rows: int) -> list[str]:
    decodings = [d for m in modes.values() for d in m.get("decodings", [])]
    if not decodings:
        return []
    lines = [
        f"Decodings, one image through the strategies' `decode()`, each cut after {rows} rows by its row callback; in",
        "the compiled modes after a warm-up decode of the same rows and seed, which compiles. A pass is seconds /",
        "forward passes (the prefill among them), both from `out.stats`; GB/s is the weights' bytes x passes a",
        "second. The ratio divides a pass by the bare pass of its width (`ar`: 1 token; `ssd`, `exact`: a row), of",
        "the mode it names, captured where it was measured. Calls: the decode's passes and steps that ran compiled /",
        "eagerly; graphs: compiled during the warm-up / the timed decode (a graph compiled while timed is a",
        "recompile).",
        "",
        "| mode | decoding | rows | passes | seconds | ms / pass | GB/s | a pass / bare pass | calls | graphs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d in decodings:
        ratio = d.get("per_bare_pass")
        said = f"{ratio['value']:.2f}x ({ratio['numerator']} / {ratio['denominator']})" if ratio else "-"
        warm = d.get("warmup", {}).get("graphs_compiled", "-")
        lines.append(
            f"| {d['mode']} | {d['decoding']} | {d['rows']} | {d['passes']} | {d['seconds']:.3f} | "
            f"{1e3 * d['seconds_per_pass']:.2f} | {d['gb_per_s']:.3g} | {said} | {d['compiled_calls']} / "
            f"{d['eager_calls']} | {warm} / {d['graphs_compiled']} |"
        )
    said = sorted(
        {(d["mode"], w) for d in decodings for w in [*d.get("warmup", {}).get("warnings", []), *d["warnings"]]}
    )
    lines += ["", *(f"- {mode}: {w}" for mode, w in said)] if said else []
    return [*lines, "", *counter_lines(modes)]


def counter_lines(modes: dict) -> list[str]:
    """dynamo's and inductor's counters over each mode's box."""
    counted = {mode: m["torch"] for mode, m in modes.items() if "torch" in m}
    lines = [
        "What torch counted over each mode's box (`torch._dynamo.utils.counters`, for the whole process: abandoned",
        "work beside a box adds its own): graphs compiled and the calls they captured, graph breaks, graphs inductor",
        "was asked to capture as CUDA graphs and ran without, FX graph cache hits / misses (inductor's compiles).",
        "A captured skip on a GPU is a regression (`TORCH_LOGS=cudagraphs` names its reason); on a CPU nothing is",
        "captured, so a count of 0 there says nothing.",
        "",
        "| mode | graphs | calls captured | graph breaks | CUDA-graph skips | FX cache hits / misses |",
        "|---|---|---|---|---|---|",
    ]
    for mode, c in counted.items():
        stats, inductor = c["stats"], c["inductor"]
        breaks = ", ".join(f"{reason} x{n}" for reason, n in c["graph_break"].items()) or "0"
        lines.append(
            f"| {mode} | {stats.get('unique_graphs', 0)} | {stats.get('calls_captured', 0)} | {breaks} | "
            f"{inductor.get('cudagraph_skips', 0)} | {inductor.get('fxgraph_cache_hit', 0)} / "
            f"{inductor.get('fxgraph_cache_miss', 0)} |"
        )
    return [*lines, ""] if counted else []


def drafter_lines(modes: dict) -> list[str]:
    measured = {mode: m["drafters"] for mode, m in modes.items() if m.get("drafters")}
    if not measured:
        return []
    kinds = {kind: d["parameters"] for drafted in measured.values() for kind, d in drafted.items()}
    lines = [
        "Each vertical drafter drafting one row (the second) and sampling its codes, as block `ssd` does it",
        "(`SSDDecoding._draft_below` timed alone on random heads of this shape: an in-row drafter goes left to right,",
        "a step a cell, each with the backbone's output head and a sample), as one step of each mode (compiled: one",
        "`torch.compile`d step, `SSDDecoding._draft_row`), and its share of that mode's bare row pass.",
        "",
        "| drafter | parameters | " + " | ".join(f"ms a row, {mode} | share" for mode in measured) + " |",
        "|---|---|" + "---|---|" * len(measured),
    ]
    for kind, parameters in kinds.items():
        cells = []
        for mode, drafted in measured.items():
            row, bare = drafted.get(kind), modes[mode].get("bare_passes")
            if row is None:
                cells += ["-", "-"]
                continue
            share = f"{row['seconds_per_row'] / bare['row_pass']:.0%}" if bare else "-"
            cells += [f"{1e3 * row['seconds_per_row']:.2f}", share]
        lines.append(f"| {kind} | {parameters:,} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def projection_lines(res: dict, grid: list[int]) -> list[str]:
    if not res.get("projections"):
        return []
    lines = [
        "One image at the 7B shape: AR = prefill + cells x the 1-token pass; SSD = prefill + N x (a row pass + the",
        "per-cell heads), every pass charged a full row (an upper bound), the passes B measured in mode",
        f"`{res['bare_passes_of']}`. N is the paper's, or the reference model's passes against AR's (section A,",
        "float32, one image) scaled to this grid.",
        *(
            []
            if grid == [24, 24]
            else [f"The {grid[0]} x {grid[1]} grid has no published counts: {bs.paper_passes(grid)} stand in."]
        ),
        "",
        "| N from | decoding | N | AR seconds | SSD seconds | speedup |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {p['source']} | {p['decoding']} | {p['ssd_passes']} | {p['ar_seconds']:.3f} | {p['ssd_seconds']:.3f} | "
        f"{p['speedup']:.2f}x |"
        for p in res["projections"]
    ]
    return [*lines, ""]


def memory_lines(res: dict, on_gpu: bool) -> list[str]:
    if not on_gpu:
        return ["Measured on CUDA only (`torch.cuda.max_memory_allocated`): null on the CPU.", ""]
    lines = ["Each section's peak of allocated memory (the 7B backbone, built in B, stays for E).", ""]
    lines += ["| section | peak GiB |", "|---|---|"]
    lines += [f"| {name} | {gib} |" for name, gib in res["peak_memory_gib"].items() if gib is not None]
    return [*lines, ""]


def host_sync_lines(res: dict) -> list[str]:
    if not res.get("modes"):
        return []
    lines = [
        f"B's decodes over {res['rows']} rows, counted inside each mode's box while its graphs were warm: the calls",
        "that block the host on a GPU, counted on any device by `host_syncs.count_host_syncs` (total (kinds);",
        "commonest sites) on the thread the passes run on. There the compiled functions run eagerly",
        '(`torch.compiler.set_stance("force_eager")`: dynamo does not trace under the counter\'s dispatch mode), so',
        "what is counted is the host code between the graphs, the compiled path's own; a graph holds no sync",
        '(fullgraph=True breaks on one). On CUDA, the warnings of `torch.cuda.set_sync_debug_mode("warn")` over',
        "the same decode run compiled, with their commonest sites.",
        "",
        "| mode | decoding | passes | host syncs a pass | counted | sync warnings (CUDA) | their sites |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode, counted in res["modes"].items():
        for label, r in counted.items():
            warned = "-" if r["sync_warnings"] is None else r["sync_warnings"]
            sites = ", ".join(f"{site} x{n}" for site, n in r["top_sites"]) if r["top_sites"] else "-"
            lines.append(
                f"| {mode} | {label} | {r['passes']} | {r['per_pass']:.2f} | {r['summary']} | {warned} | {sites} |"
            )
    return [*lines, ""]


def target_lines(res: dict) -> list[str]:
    lines = ["| target | bound | measured | met |", "|---|---|---|---|"]
    for r in res["rows"]:
        met = {True: "yes", False: "no", None: "-"}.get(r["met"], r["met"])
        lines.append(f"| {r['target']} | {r['bound']:g} | {r['measured']} | {met} |")
    return [*lines, ""]


def markdown(results: dict, on_gpu: bool) -> list[str]:
    """gpu.md below its title and command: the environment, on a CPU what its figures are, then each section."""
    env = results["environment"]
    lines = [
        f"Device: {env['device']}; the reference model in {' and '.join(env['reference_dtypes'])}, the Janus-Pro-7B",
        f"shape in {env['janus_dtype']}; torch {env['torch']}, transformers {env['transformers']}, diffusers",
        f"{env['diffusers']}, Python {env['python']}, {env['cpu_threads']} CPU thread(s); started {env['started']},",
        f"deadline {env['deadline_seconds']:g} s. The same figures as JSON: `gpu.json` beside this file.",
        "",
        *(cpu_note() if not on_gpu else []),
    ]
    body = {
        "A": lambda res: reference_lines(res, env["reference_batches"]),
        "B": lambda res: janus_lines(res, env["janus_dtype"], env["tiny"]),
        "C": lambda res: projection_lines(res, results["B"].get("grid")),
        "D": lambda res: memory_lines(res, on_gpu),
        "E": host_sync_lines,
        "F": target_lines,
        "Q": quantized_lines,
    }
    for name, lines_of in body.items():
        lines += heading(name, results[name])
        if results[name]["status"] != "not run":
            lines += lines_of(results[name])
    if on_gpu:
        lines += GPU_HOWTO
    return lines


def size(count: int) -> str:
    return f"{count / 2**30:.2f} GiB" if count >= 2**30 else f"{count / 2**20:.2f} MiB"


def quantized_lines(res: dict) -> list[str]:
    lines = [
        "Janus-Pro-7B's shape with random weights, its language model's linear layers quantized in place (int8:",
        "torchao weight-only; nf4: bitsandbytes, computing in the model's dtype); one image with guidance, the cache",
        "holding the prompt and half the image, median seconds. Weights: the backbone's bytes as stored. On CUDA,",
        "allocated: what the backbone and heads hold; peak: the most allocated during the passes (the CUDA context,",
        f"some 0.5 GiB, comes on top); fits: that peak within {' and '.join(map(str, CARDS_GIB))} GiB.",
        "",
        "| precision | weights | allocated GiB | peak GiB | fits 8 / 12 GiB | 1-token pass ms | row pass ms | row / 1-token |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in res.get("rows", []):
        if r["status"] != "ran":
            lines.append(f"| {r['precision']} | **{r['status']}**: {r['reason']} |  |  |  |  |  |  |")
            continue
        cuda = "allocated_gib" in r
        fits = " / ".join("yes" if r[f"fits_{gib}gib"] else "no" for gib in CARDS_GIB) if cuda else "-"
        lines.append(
            f"| {r['precision']} | {size(r['weight_bytes'])} | "
            + (f"{r['allocated_gib']:.2f} | {r['peak_gib']:.2f} | " if cuda else "- | - | ")
            + f"{fits} | {1e3 * r['seconds']['ar_step']:.2f} | {1e3 * r['seconds']['row_pass']:.2f} | "
            + f"{r['row_per_token_pass']:.2f} |"
        )
    return [*lines, ""]
