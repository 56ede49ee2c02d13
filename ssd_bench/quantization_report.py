"""`ssd-bench quantization`'s report: the tables and the figure, from the results dictionary alone (apart from the
measuring in quantization.py, so that a report can be rewritten from the .json beside it).
"""

from __future__ import annotations

from pathlib import Path

from ssd_pipelines.plots import pyplot
from ssd_pipelines.precisions import compute_dtype

from .quantization_weights import GPU_SIZES_GIB, bytes_per_weight

COLUMNS = 11  # of the table's rows
MIB = 2**20
COLOURS = {
    "float32": "tab:gray",
    "float16": "tab:olive",
    "bfloat16": "tab:blue",
    "int8": "tab:orange",
    "nf4": "tab:green",
}


def mib(count: int | None) -> str:
    return "-" if count is None else f"{count / MIB:.2f}"


def greedy_cell(row: dict) -> str:
    if row["greedy_exact_equals_ar"]:
        return "yes"
    return f"**no**: from cell {row['greedy_first_difference']} of {row['cells']}"


def row_line(row: dict, float32: dict | None) -> str:
    """One row of the table: a refused one says why; one that failed after loading gives its bytes and why."""
    cells = [row["model"], row["precision"]]
    weights = row.get("weights")
    if weights:
        ratio = f"{weights['bytes'] / float32['weights']['bytes']:.2f}x" if float32 else "-"
        cells += [mib(weights["bytes"]), ratio]
    if row["status"] != "ran":
        cells.append(f"**{row['status']}**: {row['reason']}")
        return "| " + " | ".join(cells + [""] * (COLUMNS - len(cells))) + " |"
    ar, exact = row["decodings"]["ar"], row["decodings"]["exact"]
    acceptance = exact["first_round_acceptance"]
    cells += [
        f"{mib(ar['peak_bytes'])} / {mib(exact['peak_bytes'])}",
        f"{ar['seconds_per_image']:.3f}",
        f"{exact['seconds_per_image']:.3f}",
        f"{ar['seconds_per_image'] / exact['seconds_per_image']:.2f}x",
        f"{ar['passes']} / {exact['passes']}",
        "-" if acceptance is None else f"{acceptance:.2f}",
        greedy_cell(row),
    ]
    return "| " + " | ".join(cells) + " |"


def bytes_line(row: dict) -> str | None:
    """What one weight of a quantized run's linear layers took: codes, scales, and both with the fixed bytes."""
    quantized = (row.get("weights") or {}).get("quantized")
    if not quantized:
        return None
    per = bytes_per_weight(quantized)
    block = "output row" if per["block"] == "row" else f"{per['block']} weights"
    fixed = f" + {per['bytes_per_layer']:.0f} a layer" if per["bytes_per_layer"] else ""
    stored = quantized["code_bytes"] + quantized["block_bytes"] + quantized["layer_bytes"]
    return (
        f"| {row['model']} | {row['precision']} | {quantized['weights'] / row['weights']['parameters']:.0%} | "
        f"{per['code_bytes_per_weight']:.3f} | {per['side_bytes_per_block']:.1f} per {block}{fixed} | "
        f"{stored / quantized['weights']:.3f} |"
    )


def projection_line(p: dict) -> str:
    if p["gib"] is None:
        return f"| {p['checkpoint']} | {p['precision']} | not measured (the run of its class did not load) | | |"
    fits = ["yes" if p[f"fits_{size}gib"] else "no" for size in GPU_SIZES_GIB]
    share = p["quantized_weights"] / p["parameters"]
    quantized = f" ({share:.0%} of {p['parameters'] / 1e9:.2f} B weights quantized)" if share else ""
    return f"| {p['checkpoint']} | {p['precision']} | {p['gib']:.2f}{quantized} | {fits[0]} | {fits[1]} |"


def how_measured(env: dict) -> list[str]:
    """What the run loaded and how each column was measured."""
    on_gpu = env["device_type"] == "cuda"
    peak = (
        "`torch.cuda.max_memory_allocated` after a reset"
        if on_gpu
        else (
            "on this CPU the process's peak resident set (`VmHWM`), restarted before the call through "
            "`/proc/self/clear_refs`, with glibc returning freed blocks above 64 KiB to the system "
            "(`PeakMemory` of `ssd_bench/measure_run.py`)"
        )
    )
    noise = (
        "Synchronized after each call."
        if on_gpu
        else "CPU timings are noisy: compare ratios within this run, not with other runs."
    )
    return [
        (
            f"Machine: {env['device']}, {env['cpu_threads']} torch thread(s); torch {env['versions']['torch']}, "
            f"transformers {env['versions']['transformers']}, diffusers {env['versions']['diffusers']}, torchao "
            f"{env['versions']['torchao']}, bitsandbytes {env['versions']['bitsandbytes']}; started "
            f"{env['started']}. The same figures as JSON beside this file (`.json`), and the plot (`.png`)."
        ),
        "",
        (
            "Each model is loaded with `SSDAutoregressivePipeline.from_pretrained(..., **precision_options(name, "
            "device))` (`ssd_pipelines/quantization.py`): a float precision converts every component; int8 "
            "(torchao, weight-only) and nf4 (bitsandbytes) quantize the backbone's linear layers and compute in "
            f"{compute_dtype('int8', env['device_type'])} here. The tiny models are random instances of the "
            "published classes (hidden size "
            f"{env['tiny_width']}, 8 x 8 codes, random heads, so their acceptance means nothing); the reference model has "
            "its trained heads. One image a call, the model's default guidance, codes only "
            '(`output_type="latent"`: the VQ decoder is not run).'
        ),
        "",
        (
            "- **backbone MiB**: the backbone's parameters as stored, each storage once: a torchao weight by its "
            "inner tensors (int8 codes, scales, zero points), a bitsandbytes one by its packed codes and its "
            "quant_state (absmax, code book); `numel * element_size` would count their dequantized shape."
        ),
        (
            "- **peak MiB**: what one call allocated above what was live before it, the larger of its timed calls: "
            f"{peak}. The tiny models' calls allocate too little for this to resolve."
        ),
        (
            f"- **s / image**: wall seconds of one call, median of {env['repeats']} with the same seed (the same "
            f"passes each time), after the greedy check's two calls warmed the backbone. {noise}"
        ),
        (
            '- **passes**: forward passes (`out.stats["forward_passes"]`); `ar` takes one a code. **acceptance**: '
            '`exact`\'s first-round acceptance (`out.stats["acceptance_per_round"][0]`).'
        ),
        (
            "- **greedy exact == ar**: at temperature 0, `exact`'s codes against `ar`'s on the same backbone: "
            "`exact` is lossless with respect to the backbone it runs on, quantized or not."
        ),
        "",
    ]


def rows_table(rows: list[dict]) -> list[str]:
    """One row per model and precision."""
    float32 = {r["model"]: r for r in rows if r["precision"] == "float32" and r.get("weights")}
    return [
        (
            "| model | precision | backbone MiB | vs float32 | peak MiB ar / exact | s / image ar | s / image exact | "
            "exact's speedup | passes ar / exact | acceptance | greedy exact == ar |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *(row_line(r, float32.get(r["model"])) for r in rows),
        "",
    ]


def bytes_table(rows: list[dict]) -> list[str]:
    """What one weight of the quantized linear layers took, as loaded."""
    return [
        (
            "The quantized linear layers as loaded: the share of the backbone's weights they hold, their codes' "
            "bytes a weight, the bytes kept beside them per block of weights sharing a scale (scales and zero "
            "points, or absmax) and per layer (bitsandbytes' code book), and all together a weight. On a CPU with "
            "AVX512-BF16, bitsandbytes repacks a 4-bit layer at its first call and keeps its absmax in bfloat16 "
            "from then on (2 bytes a block instead of 4); the figures here are those of the loaded model, which a "
            "GPU keeps."
        ),
        "",
        "| model | precision | share of weights | code bytes / weight | side bytes | bytes / weight |",
        "|---|---|---|---|---|---|",
        *filter(None, (bytes_line(r) for r in rows)),
        "",
    ]


def projection_table(projected: list[dict]) -> list[str]:
    sizes = " and ".join(f"{size} GiB" for size in GPU_SIZES_GIB)
    return [
        "## Projection to the published checkpoints (not measured)",
        "",
        (
            "**A projection, not a measurement**: no real checkpoint was loaded. Each checkpoint's shape is built "
            "on the meta device from its config (Janus-Pro-7B with its SigLIP-L vision tower and an output head "
            "apart from its embeddings). The layers its class's tiny runs quantized (every linear layer but the "
            "output head `lm_head`, as on a GPU, where nf4 keeps none out as it may on a CPU) take the bytes each "
            "precision's run measured a weight and a scale block (an int8 block is a row of each layer); every other "
            "weight (embeddings, output head, norms, convolutions) stays in the "
            "compute dtype a GPU uses, bfloat16. The side bytes are the CPU run's (float32 scales: a GPU's "
            f"bfloat16 ones take a little less). Weights alone, against cards of {sizes}: the key/value cache, "
            "activations and the CUDA context come on top (docs/backbones.md gives the cache per image)."
        ),
        "",
        f"| checkpoint | precision | weights GiB (projected) | fits {GPU_SIZES_GIB[0]} GiB | "
        + f"fits {GPU_SIZES_GIB[1]} GiB |",
        "|---|---|---|---|---|",
        *(projection_line(p) for p in projected),
    ]


def half_precision(precision: str, device_type: str) -> bool:
    """Whether the passes round to half precision: a half dtype, or nf4 on a CPU with AVX512-BF16, whose
    bitsandbytes kernels compute in bfloat16."""
    if precision == "nf4" and device_type == "cpu":
        from bitsandbytes.functional import has_avx512bf16

        return has_avx512bf16()
    return compute_dtype(precision, device_type) in ("bfloat16", "float16")


def notes(rows: list[dict], device_type: str) -> list[str]:
    """What the table's exceptions mean: greedy `exact` parting from `ar`, and rows that failed after loading."""
    parted = [r for r in rows if r.get("greedy_exact_equals_ar") is False]
    half = [f"{r['model']} in {r['precision']}" for r in parted if half_precision(r["precision"], device_type)]
    other = [f"{r['model']} in {r['precision']}" for r in parted if not half_precision(r["precision"], device_type)]
    lines = []
    if half:
        lines += [
            (
                f"Greedy `exact` parts from greedy `ar` on {', '.join(half)}, which compute in half precision (on a "
                "CPU with AVX512-BF16, bitsandbytes' kernels run nf4 layers in bfloat16). "
                "`exact` is lossless with respect to a backbone whose logits for a cell do not depend on how many "
                "tokens a pass carries, and in half precision they do: a pass over one token (`ar`) and a pass over "
                "a window (`exact`) sum in different orders and round to 8 bits of mantissa, so where a cell's two "
                "best codes lie within a rounding step of each other the two passes may rank them differently, and "
                "the grids part from that cell on (`ssd-bench gpu` checks greedy agreement in float32 for this "
                "reason)."
            ),
            "",
        ]
    if other:
        lines += [f"**Greedy `exact` parts from greedy `ar` on {', '.join(other)}, in full precision: a bug.**", ""]
    if device_type == "cpu" and half_precision("nf4", device_type) and any(r["precision"] == "nf4" for r in rows):
        lines += [
            (
                "On this CPU (AVX512-BF16), nf4 keeps in float32 the linear layers that bitsandbytes' kernels cannot "
                "repack, those not a multiple of 32 wide or whose input is not a multiple of 64: the reference "
                "model's MLPs, 688 wide (`quantization.fit_nf4_to_cpu`, which warns). The bytes table below gives "
                "the share of each backbone's weights that went to 4 bits."
            ),
            "",
        ]
    if any(r["status"] == "failed" for r in rows):
        lines += [
            (
                "A row that **failed** loaded (its bytes are given, and count in the projection) and raised at its "
                "first call."
            ),
            "",
        ]
    return lines


def markdown(results: dict) -> list[str]:
    """The file below its title and command: the machine and method, the plot, the tables."""
    plot_line = f"![backbone bytes and seconds against float32, and the checkpoints projected]({results['plot']})"
    return [
        *how_measured(results["environment"]),
        plot_line,
        "",
        *rows_table(results["rows"]),
        *notes(results["rows"], results["environment"]["device_type"]),
        *bytes_table(results["rows"]),
        *projection_table(results["projections"]),
    ]


def plot(results: dict, path: Path) -> None:
    """Three panels: backbone bytes and `exact`'s seconds per image against the same model's float32, per
    precision; the published checkpoints' projected GiB against the cards' sizes. One legend for all three."""
    plt = pyplot()
    from matplotlib.patches import Patch  # only once a figure is being drawn: matplotlib is optional

    precisions = results["precisions"]
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    measured = [
        ("weights", lambda r: r["weights"]["bytes"], "backbone bytes / float32's (measured)"),
        ("decodings", lambda r: r["decodings"]["exact"]["seconds_per_image"], "exact's s / image / float32's"),
    ]
    for ax, (needs, value, title) in zip(axes, measured):
        plot_against_float32(ax, results["rows"], precisions, needs, value)
        ax.set_title(title, fontsize=10)
    plot_projection(axes[2], results["projections"], precisions)
    handles = [Patch(color=COLOURS[precision], label=precision) for precision in precisions]
    figure.legend(handles=handles, loc="upper center", ncol=len(precisions), fontsize=9, frameon=False)
    figure.suptitle(results["environment"]["device"], x=0.01, ha="left", fontsize=9)
    figure.tight_layout(rect=(0, 0, 1, 0.93))
    figure.savefig(path, dpi=90)
    plt.close(figure)


def plot_against_float32(ax, rows: list[dict], precisions: list[str], needs: str, value) -> None:
    """Bars of `value` over the same model's float32 one, grouped by model; a row without it says its status."""
    labels = list(dict.fromkeys(r["model"] for r in rows))
    by = {(r["model"], r["precision"]): r for r in rows}
    width = 0.8 / len(precisions)
    for i, precision in enumerate(precisions):
        for j, label in enumerate(labels):
            row, base = by.get((label, precision)), by.get((label, "float32"))
            x = j + (i - (len(precisions) - 1) / 2) * width
            if row and needs in row and base and needs in base:
                ax.bar(x, value(row) / value(base), width, color=COLOURS[precision])
            elif row:
                ax.text(x, 0.02, row["status"], rotation=90, ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.6)
    ax.set_xticks(range(len(labels)), [label.replace(" (tiny)", "\n(tiny)") for label in labels], fontsize=8)


def plot_projection(ax, projected: list[dict], precisions: list[str]) -> None:
    """The published checkpoints' projected weights per precision, with the GPU sizes as lines."""
    names = list(dict.fromkeys(p["checkpoint"] for p in projected))
    width = 0.8 / len(precisions)
    for i, precision in enumerate(precisions):
        for j, name in enumerate(names):
            p = next(p for p in projected if (p["checkpoint"], p["precision"]) == (name, precision))
            if p["gib"] is not None:
                ax.bar(j + (i - (len(precisions) - 1) / 2) * width, p["gib"], width, color=COLOURS[precision])
    for size in GPU_SIZES_GIB:
        ax.axhline(size, color="black", linestyle="--", linewidth=0.8)
        ax.text(len(names) - 0.5, size, f"{size} GiB", ha="right", va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_ylabel("GiB", fontsize=8)
    ax.set_title("published checkpoints: weights, projected", fontsize=10)
