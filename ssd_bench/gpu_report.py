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


def targets(results: dict, on_gpu: bool) -> list[dict]:
    """F: issue 39's targets against what ran; judged on a GPU only."""
    janus, projections = results["B"], results["C"].get("projections", [])
    bare, drafters = janus.get("bare_passes", {}), janus.get("drafters", {})
    reference = {(r["dtype"], r["decoding"], r["images"]): r for r in results["A"].get("runs", [])}
    rows = []
    for r in janus.get("decodings", []):
        width = "1-token" if r["bare_pass"] == "ar_step" else "row"
        target = Target(f"7B: {r['decoding']} ({r['mode']}), a pass / the bare {width} pass", 1.25, "{:.2f}x")
        rows.append(target.row(r["per_bare_pass"], on_gpu))
    ar_step = bare.get("ar_step")
    rows.append(Target("7B: the 1-token pass, 1 image (ms)", 8.5, "{:.2f} ms").row(ar_step and 1e3 * ar_step, on_gpu))
    for r in janus.get("decodings", []):
        if r["decoding"] == "ar":
            rows.append(Target(f"7B: ar ({r['mode']}), one image (s)", 6.0, "{:.2f} s").row(r["seconds"], on_gpu))
    r2 = next((p for p in projections if (p["source"], p["decoding"]) == ("paper", "ssd r=2")), None)
    what = (
        f"7B: ssd r=2 projected at {r2['ssd_passes'] if r2 else 80} passes (the paper's 80 on 24 x 24), one image (s)"
    )
    rows.append(Target(what, 1.4, "{:.2f} s").row(r2 and r2["ssd_seconds"], on_gpu))
    recurrent = drafters.get("recurrent", {})
    row = recurrent.get("seconds_per_row_compiled", recurrent.get("seconds_per_row"))
    share = row / bare["row_pass"] if row and "row_pass" in bare else None
    what = "7B: the recurrent drafter's row (compiled) / a row pass"
    rows.append(Target(what, 0.25, "{:.0%}").row(share, on_gpu))
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
        "the reference model with one timed repeat and 2 images for 16. They check that the code paths run and",
        'that greedy decodings agree; their seconds say nothing of a GPU. Every target awaits a GPU ("n/a (CPU)"',
        "below): the 7B shape's cost per pass against the bare pass, its 1-token pass, `ar`'s seconds and projected",
        "`ssd` r=2's for one image, the recurrent drafter's share of a row pass, the reference model's milliseconds",
        "a pass for `ar` and bf16 `exact` against bf16 `ar`.",
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


def janus_lines(res: dict, dtype: str) -> list[str]:
    if "grid" not in res:
        return []
    rows, cols = res["grid"]
    lines = [
        f"`JanusForConditionalGeneration` of Janus-Pro-7B's shape ({res['backbone_parameters']:,} parameters,",
        f"{rows} x {cols} grid), random {dtype} weights (built in {res['build_seconds']} s), guidance batched (2 rows",
        f"an image), one image, a {bs.PROMPT_TOKENS}-token prompt. Random weights make acceptance meaningless: compare",
        "seconds per pass, not passes.",
        "",
    ]
    bare = res.get("bare_passes")
    if bare:
        gb_per_s = bare["pass_bytes"] / bare["ar_step"] / 1e9
        lines += [
            "| bare pass (`backbone_speed.measure`) | ms |",
            "|---|---|",
            f"| prefill ({bs.PROMPT_TOKENS} prompt tokens) | {1e3 * bare['prefill']:.2f} |",
            f"| 1 token (`ar_step`: extend + code logits) | {1e3 * bare['ar_step']:.2f} |",
            f"| one row, {cols} tokens (`row_pass`) | {1e3 * bare['row_pass']:.2f} |",
            f"| per-cell vertical heads over a row | {1e3 * bare['heads']:.2f} |",
            "",
            f"Bandwidth achieved by the 1-token pass: {bare['pass_bytes'] / 1e9:.3g} GB of weights (the language",
            f"model's layers and the image head) in {1e3 * bare['ar_step']:.2f} ms = {gb_per_s:.3g} GB/s.",
            "",
        ]
    if res.get("drafters"):
        lines += [
            "Each vertical drafter drafting one row (the second) and sampling its codes, as block `ssd` does it:",
            "`SSDDecoding._draft_below` timed alone on random heads of this shape (an in-row drafter goes left to",
            "right, a step a cell, each with the backbone's output head and a sample), eager and compiled (the row",
            "one `torch.compile`d step, `SSDDecoding._draft_row`).",
            "",
            "| drafter | parameters | ms a row, eager | share of a row pass | ms a row, compiled | share |",
            "|---|---|---|---|---|---|",
        ]
        for kind, d in res["drafters"].items():
            eager, compiled = d["seconds_per_row"], d["seconds_per_row_compiled"]
            shares = [f"{t / bare['row_pass']:.0%}" if bare else "-" for t in (eager, compiled)]
            lines.append(
                f"| {kind} | {d['parameters']:,} | {1e3 * eager:.2f} | {shares[0]} | {1e3 * compiled:.2f} | {shares[1]} |"
            )
        lines.append("")
    if res.get("decodings"):
        lines += [
            "End to end, one image through the strategies' `decode()`, once each; a pass against the bare pass of its",
            "width (`ar`: 1 token; `ssd`, `exact`: a row). Mode `compiled`: the backbone's passes and the engines'",
            "steps between them (drafting, verification) through `torch.compile` (`pipe.enable_compiled_passes()`),",
            "timed after a first decode that compiles. Mode `captured`: the same with static shapes, replayed as CUDA",
            'graphs (`pipe.enable_compiled_passes(mode="reduce-overhead")`). With `--tiny`, both are traced with the',
            "`eager` backend, which checks the path, not the speed.",
            "",
            "| mode | decoding | passes | seconds | ms / pass | / bare pass |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['mode']} | {r['decoding']} | {r['passes']} | {r['seconds']:.3f} | {r['ms_per_pass']:.2f} | "
            f"{r['per_bare_pass']:.2f}x |"
            for r in res["decodings"]
        ]
        lines.append("")
    if "cudagraph_skips" in res:
        lines += [
            f"Graphs of the `captured` mode inductor ran without a CUDA graph: {res['cudagraph_skips']}. It skips one",
            "that writes a tensor not held at a fixed address; the engine holds what its graphs write (docs/decoding.md,",
            '"Captured passes"), so any skip is a regression, and `TORCH_LOGS=cudagraphs` names its reason. With',
            "`--tiny` nothing is asked to be captured, so nothing is skipped.",
            "",
        ]
    return lines


def projection_lines(res: dict, grid: list[int]) -> list[str]:
    if not res.get("projections"):
        return []
    lines = [
        "One image at the 7B shape: AR = prefill + cells x the 1-token pass; SSD = prefill + N x (a row pass + the",
        "per-cell heads), every pass charged a full row (an upper bound). N is the paper's, or the reference model's",
        "passes against AR's (section A, float32, one image) scaled to this grid.",
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
    if not res.get("decodings"):
        return []
    lines = [
        "B's decodes once more: the calls that block the host on a GPU, counted on any device by",
        "`host_syncs.count_host_syncs` (total (kinds); commonest sites), and on CUDA the warnings of",
        '`torch.cuda.set_sync_debug_mode("warn")` with their commonest sites.',
        "",
        "| decoding | passes | host syncs a pass | counted | sync warnings (CUDA) | their sites |",
        "|---|---|---|---|---|---|",
    ]
    for label, r in res["decodings"].items():
        warned = "-" if r["sync_warnings"] is None else r["sync_warnings"]
        sites = ", ".join(f"{site} x{n}" for site, n in r["top_sites"]) if r["top_sites"] else "-"
        lines.append(f"| {label} | {r['passes']} | {r['per_pass']:.2f} | {r['summary']} | {warned} | {sites} |")
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
        "B": lambda res: janus_lines(res, env["janus_dtype"]),
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
