"""`ssd` in the paper's row blocks against `ssd` pipelined on `exact`'s sliding window: passes against quality.

In blocks, a row gets r verification rounds and then a commit pass, and the next
row waits for it. Pipelined (`window=`), the rows overlap on the sliding window
and each cell is kept as it is after its r-th verification; the frontier commits
as `exact`'s does. The same r therefore means different things: a pipelined cell
may spend its checks while the cells before it still change. So the benchmark
sweeps r both ways and compares them where it matters, quality at equal passes.
Quality is the adherence and the Fréchet distance of `ssd-bench peers` on the same
held-out prompts and seeds; passes are exact, seconds are medians of interleaved
single-image calls.

    ssd-bench pipelined      # about 15 minutes on one CPU thread -> docs/ssd_pipelined.md and its figures
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ssd_pipelines.acceptance import format_rates
from ssd_pipelines.decoding import make_strategy
from ssd_pipelines.hub import default_model
from ssd_pipelines.pipeline_ssd import SSDAutoregressivePipeline
from ssd_pipelines.plots import image_grid, pyplot
from ssd_pipelines.reference.quality import load_quality_net
from ssd_pipelines.reference.scenes import HELDOUT_SEED_START, sample_scene
from ssd_pipelines.sampling_config import SamplingConfig

from . import commands, plots, report
from .image_quality import generate, judge
from .measure_run import run_once
from .peers import real_reference

BLOCK_ROUNDS = (0, 1, 2, 3)
PIPELINED_ROUNDS = (1, 2, 3, 4, 6)
GRID_LABELS = ("ar", "ssd r=2", "ssd W=17 r=2", "ssd W=17 r=4", "ssd W=17 r=6", "exact")
GRID_PROMPTS = 6


def decodings(windows: list[int]) -> dict[str, tuple[str, dict]]:
    """label -> (strategy, options): ar, exact, ssd in blocks, and ssd pipelined on each window."""
    options = {"ar": ("ar", {}), "exact": ("exact", {})}
    options |= {f"ssd r={r}": ("ssd", {"verify_rounds": r}) for r in BLOCK_ROUNDS}
    for window in windows:
        options |= {f"ssd W={window} r={r}": ("ssd", {"verify_rounds": r, "window": window}) for r in PIPELINED_ROUNDS}
    return options


def single_image_speed(pipe, strategies: dict, captions: list[str], sampling, repeats: int) -> dict[str, dict]:
    """label -> mean passes and median seconds of single-image calls, every strategy's calls interleaved."""
    costs = {label: [] for label in strategies}
    with tqdm(total=repeats * len(strategies), desc="speed", unit="call") as progress:
        for rep in range(repeats):
            for label, strategy in strategies.items():
                caption = captions[rep % len(captions)]
                costs[label].append(run_once(strategy, pipe.image_backbone, [caption], sampling, seed=rep))
                progress.update()
    return {
        label: {
            "passes": statistics.mean(c.passes for c in runs),
            "seconds": statistics.median(c.seconds for c in runs),
        }
        for label, runs in costs.items()
    }


def table(rows: dict[str, dict]) -> list[str]:
    ar = rows["ar"]
    lines = [
        (
            "| decoding | passes, 1 image | fewer passes than AR | seconds, 1 image | speedup | Fréchet | adherence | "
            "acceptance in the 1st..4th check |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, r in rows.items():
        lines.append(
            f"| {label} | {r['passes']:.1f} | {ar['passes'] / r['passes']:.1f}x | {r['seconds']:.3f} | "
            f"{ar['seconds'] / r['seconds']:.2f}x | {r['frechet']:.0f} | {r['adherence']:.3f} | "
            f"{format_rates(r['acceptance'][:4])} |"
        )
    return lines


def figure(rows: dict[str, dict], floor: float, out: Path) -> None:
    """Passes per image against the Fréchet distance: one line for blocks, one per window, AR and exact as points."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=110)
    families: dict[str, list[tuple[float, float, str]]] = {}
    for label, r in rows.items():
        family = "ssd in row blocks" if label.startswith("ssd r=") else label.rsplit(" r=", 1)[0]
        families.setdefault(family, []).append((r["passes"], r["frechet"], label.rsplit(" ", 1)[-1]))
    for family, points in families.items():
        xs, ys = [x for x, _, _ in sorted(points)], [y for _, y, _ in sorted(points)]
        if len(points) == 1:
            ax.scatter(xs, ys, s=60, color=plots.COLOURS.get(family, "grey"), zorder=3, label=family)
        else:
            ax.plot(xs, ys, marker="o", label=family.replace("ssd W=", "ssd pipelined, W="))
            for x, y, name in points:
                ax.annotate(name, (x, y), xytext=(5, 4), textcoords="offset points", fontsize=8)
    ax.axhline(floor, color="grey", linestyle=":", linewidth=1, label="real renders (floor)")
    ax.set_yscale("log")
    ax.set_xlabel("forward passes per image (batch 1)")
    ax.set_ylabel("Fréchet distance to real renders (log; lower is better)")
    ax.set_title("ssd in row blocks against ssd pipelined, reference model")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    args = commands.pipelined_parser().parse_args(argv)

    torch.set_num_threads(args.threads)
    pipe = SSDAutoregressivePipeline.from_pretrained(args.model or default_model(), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    backbone, grid = pipe.image_backbone, pipe.image_backbone.grid
    options = decodings(args.windows or [grid.row_length])
    strategies = {label: make_strategy(name, pipe.heads, **o) for label, (name, o) in options.items()}
    sampling = SamplingConfig(temperature=1.0, guidance_scale=args.guidance)
    scenes = [sample_scene(HELDOUT_SEED_START + i) for i in range(args.prompts)]
    net = load_quality_net()
    n_images = args.prompts * args.images_per_prompt
    reference, floors = real_reference(pipe, net, max(args.reference_renders, args.prompts), n_images)

    speed = single_image_speed(pipe, strategies, [s.caption for s in scenes], sampling, args.repeats)
    sets = {}
    with tqdm(total=len(strategies) * n_images, desc="quality", unit="image") as progress:
        for label, strategy in strategies.items():
            sets[label] = generate(strategy, backbone, scenes, args.images_per_prompt, 16, sampling, progress.update)
    rows = {}
    for label, generated in sets.items():
        quality = judge(generated, scenes, args.images_per_prompt, net, reference, sets["ar"].codes, grid.codebook_size)
        rows[label] = {
            **speed[label],
            "frechet": quality.frechet,
            "adherence": quality.adherence,
            "acceptance": generated.acceptance,
        }

    stem = args.out.with_suffix("")
    curve, images = Path(f"{stem}.png"), Path(f"{stem}_images.png")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure(rows, floors["real"], curve)
    shown = [label for label in GRID_LABELS if label in sets]
    image_grid(
        {label: sets[label].images[: GRID_PROMPTS * args.images_per_prompt] for label in shown},
        [s.caption for s in scenes[:GRID_PROMPTS] for _ in range(args.images_per_prompt)],
        images,
    )
    lines = [
        (
            f"Reference model, guidance {args.guidance}, temperature 1, {args.threads} CPU thread(s). Quality: "
            f"{n_images} images ({args.prompts} held-out prompts x {args.images_per_prompt}); the Fréchet distance "
            f"of real renders to the reference set is {floors['real']:.0f} (the floor), of real renders through the "
            f"VQ tokenizer {floors['tokenizer']:.0f}. Speed: the median of {args.repeats} single-image calls, "
            "interleaved. `ssd r=k` decodes the paper's row blocks; `ssd W=w r=k` pipelines the rows on a window of "
            f"w positions (one row is {grid.row_length}, its end-of-line included)."
        ),
        "",
        *table(rows),
        "",
        f"![passes against Fréchet distance]({curve.name})",
        "",
        f"![the first {GRID_PROMPTS} prompts]({images.name})",
    ]
    report(lines, args.out, "ssd: row blocks or pipelined", "ssd-bench pipelined")


if __name__ == "__main__":
    main()
