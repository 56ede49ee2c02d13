"""`exact`'s window size: forward passes, positions processed and seconds, at batch 1 and batch 8.

A wider window verifies cells further past the frontier, so it takes fewer
passes, but every pass processes W positions of every image: on a CPU a pass
costs about its token count, so the fastest window is a trade-off, while on a
GPU a wider pass is nearly free and the pass count is what matters. Every
decoding runs on the same held-out prompts and seeds, interleaved, so machine
noise hits all alike; pass and position counts are exact, seconds are medians.

    ssd-bench window          # prints the table, writes docs/exact_window.md
"""

from __future__ import annotations

import statistics

import torch
from tqdm.auto import tqdm

from ssd_pipelines.acceptance import format_rates
from ssd_pipelines.hub import default_model
from ssd_pipelines.pipeline_ssd import SSDAutoregressivePipeline
from ssd_pipelines.reference.scenes import HELDOUT_SEED_START, sample_scene

from . import commands, report


def decodings(row_length: int, windows: list[int]) -> dict[str, dict]:
    """ar, then exact at each window (in positions; one row is `row_length`)."""
    options = {"ar": {"decoding": "ar"}}
    for window in windows:
        rows = f" ({window / row_length:g} rows)" if window % row_length == 0 else ""
        options[f"exact W={window}{rows}"] = {"decoding": "exact", "window": window}
    return options


def measure(pipe, options: dict[str, dict], prompts: list[str], batch: int, guidance: float) -> dict[str, dict]:
    """Every decoding on every group of `batch` prompts, interleaved; per image: passes, positions, seconds."""
    groups = [prompts[i : i + batch] for i in range(0, len(prompts) - batch + 1, batch)]
    runs: dict[str, list[dict]] = {label: [] for label in options}
    with tqdm(total=len(groups) * len(options), desc=f"batch {batch}", unit="call") as progress:
        for seed, group in enumerate(groups):
            for label, decoding in options.items():
                generator = torch.Generator().manual_seed(seed)
                out = pipe(group, guidance_scale=guidance, generator=generator, output_type="latent", **decoding)
                runs[label].append(out.stats)
                progress.update()
    return {label: summarise(stats, batch) for label, stats in runs.items()}


def summarise(stats: list[dict], batch: int) -> dict:
    """Means of the exact counts, median seconds per image, and how often cells were verified."""
    drafted = [sum(s["drafted_per_round"][k] for s in stats if k < len(s["drafted_per_round"])) for k in range(8)]
    accepted = [sum(s["accepted_per_round"][k] for s in stats if k < len(s["accepted_per_round"])) for k in range(8)]
    return {
        "passes": statistics.mean(s["forward_passes"] for s in stats),
        "positions": statistics.mean(s["positions_processed"] for s in stats),
        "seconds": statistics.median(s["seconds"] for s in stats) / batch,
        "acceptance": [a / d for a, d in zip(accepted, drafted) if d][:4],
        "verified": [d for d in drafted if d],  # cells verified at least k + 1 times
    }


def table(results: dict[str, dict], batch: int) -> list[str]:
    ar = results["ar"]
    lines = [
        f"Batch {batch} (seconds per image):",
        "",
        (
            "| decoding | passes | fewer passes than AR | positions / image | seconds / image | speedup | "
            "acceptance in the 1st..4th check | cells checked 2+ / 3+ / 4+ times (share of the 1st) |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, r in results.items():
        verified = r["verified"]
        again = " / ".join(f"{v / verified[0]:.2f}" for v in verified[1:4]) if verified else "-"
        lines.append(
            f"| {label} | {r['passes']:.1f} | {ar['passes'] / r['passes']:.1f}x | {r['positions']:.0f} | "
            f"{r['seconds']:.3f} | {ar['seconds'] / r['seconds']:.2f}x | {format_rates(r['acceptance'])} | {again} |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    args = commands.window_parser().parse_args(argv)

    torch.set_num_threads(args.threads)
    pipe = SSDAutoregressivePipeline.from_pretrained(args.model or default_model())
    pipe.set_progress_bar_config(disable=True)
    grid = pipe.image_backbone.grid
    windows = args.windows or [4, 8, grid.row_length, 2 * grid.row_length, 4 * grid.row_length, 8 * grid.row_length]
    options = decodings(grid.row_length, windows)
    prompts = [sample_scene(HELDOUT_SEED_START + i).caption for i in range(args.prompts)]
    lines = [
        (
            f"Reference model ({grid.rows} x {grid.cols} codes, {grid.row_length} positions a row with its "
            f"end-of-line), {args.prompts} held-out prompts, guidance {args.guidance} batched, temperature 1, "
            f"{args.threads} CPU thread(s); W is in positions."
        ),
        "",
    ]
    for batch in (1, 8):
        lines += [*table(measure(pipe, options, prompts, batch, args.guidance), batch), ""]
    report(lines, args.out, "exact: window size", "ssd-bench window")


if __name__ == "__main__":
    main()
