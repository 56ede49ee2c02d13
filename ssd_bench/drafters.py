"""Drafting heads against each other on the reference backbone: the ablation of the drafter and its training.

Every set of heads decodes the same held-out prompts with the same seeds, in
each of the paper's `ssd` r=2, `ssd` r=1, windowed `ssd` (W=17 r=4 and r=6,
the lossy candidates for the default) and `exact`, beside one AR run:
first-round acceptance, passes and seconds for one image, Fréchet distance to
real renders, adherence (paired against AR), and the share of a call's time
spent drafting. Acceptance alone is not the look (docs/decoding.md): the table
and its figure put acceptance and Fréchet distance side by side against passes.
Below them, each set of heads against the drafts' targets (`targets.py`).

    ssd-bench drafters --heads "per-cell, smooth L1=hub_cards/ssd-reference/heads" --heads "in-row, KL=runs/h"
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from tqdm import tqdm

from ssd_pipelines.acceptance import format_rates
from ssd_pipelines.heads import DraftHeads
from ssd_pipelines.hub import default_model
from ssd_pipelines.pipeline_ssd import SSDAutoregressivePipeline
from ssd_pipelines.plots import pyplot
from ssd_pipelines.reference.quality import frechet_to_heldout
from ssd_pipelines.reference.scenes import HELDOUT_SEED_START, sample_scene

from . import commands, report
from .measure_run import one_image_call, summarize_calls
from .reference import adherence, paired_difference, versus_baseline
from .targets import targets_table

DECODINGS: dict[str, dict] = {
    "ssd r=2": {"decoding": "ssd", "verify_rounds": 2},
    "ssd r=1": {"decoding": "ssd", "verify_rounds": 1},
    "ssd W=17 r=4": {"decoding": "ssd", "verify_rounds": 4, "window": 17},  # as in `ssd-bench reference`
    "ssd W=17 r=6": {"decoding": "ssd", "verify_rounds": 6, "window": 17},
    "exact": {"decoding": "exact"},
}


def single_image(pipe, scenes, repeats: int, guidance: float, options: dict) -> dict:
    """Median seconds, mean passes and the drafting share of one-image calls."""
    calls = [one_image_call(pipe, scenes[r % len(scenes)].caption, guidance, r, options) for r in range(repeats)]
    return summarize_calls(calls)


def parse_heads(values: list[str]) -> dict[str, Path]:
    """ "label=folder" pairs, in the order given."""
    heads = {}
    for value in values:
        label, _, folder = value.rpartition("=")
        if not label or not folder:
            raise SystemExit(f"--heads takes LABEL=FOLDER, got {value!r}")
        heads[label] = Path(folder)
    return heads


def main(argv: list[str] | None = None) -> None:
    args = commands.drafters_parser().parse_args(argv)
    heads = parse_heads(args.heads)

    pipe = SSDAutoregressivePipeline.from_pretrained(args.model or default_model(), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    scenes = [sample_scene(HELDOUT_SEED_START + i) for i in range(args.prompts)]
    images = args.prompts * args.images_per_prompt
    rows, quality = [], []
    with tqdm(total=images * (1 + len(heads) * len(DECODINGS)), desc="drafters", unit="image") as bar:
        ar = {"decoding": "ar"}
        quality.append(adherence(pipe, "ar", ar, scenes, args.images_per_prompt, args.batch_size, args.guidance, bar))
        rows.append({"heads": "-", "decoding": "ar", **single_image(pipe, scenes, args.repeats, args.guidance, ar)})
        for label, folder in heads.items():
            pipe.load_heads(DraftHeads.from_pretrained(folder, use_safetensors=True))
            for decoding, options in DECODINGS.items():
                q = adherence(
                    pipe, decoding, options, scenes, args.images_per_prompt, args.batch_size, args.guidance, bar
                )
                quality.append(q)
                rows.append(
                    {
                        "heads": label,
                        "decoding": decoding,
                        **single_image(pipe, scenes, args.repeats, args.guidance, options),
                    }
                )
    for row, q, frechet in zip(
        rows, quality, frechet_to_heldout([q["images"] for q in quality], args.reference_renders)
    ):
        row |= {"frechet": frechet, "adherence": q["adherence"], "acceptance": q["acceptance"]}
        row["versus"] = versus_baseline(q["results"], quality[0]["results"], args.images_per_prompt)
        row["adherence_diff"] = paired_difference(q["results"], quality[0]["results"], args.images_per_prompt)[0]
    lines = table(rows, args)
    figure = args.out.with_suffix(".png")
    acceptance_and_frechet(rows, figure)
    lines += ["", f"![first-round acceptance and Fréchet distance against passes]({figure.name})"]
    lines += ["", "Against the targets of the drafts (met where marked):", "", *targets_table(rows)]
    report(lines, args.out, "Drafting heads: acceptance, passes and the look", "ssd-bench drafters")


def table(rows: list[dict], args: argparse.Namespace) -> list[str]:
    ar = rows[0]
    lines = [
        (
            f"Reference backbone, {args.prompts} held-out prompts x {args.images_per_prompt} images, guidance "
            f"{args.guidance}, temperature 1, the same seeds for every row; one-image timings: median of "
            f"{args.repeats}, {torch.get_num_threads()} CPU threads. Drafting: the share of a one-image call spent in "
            "the drafting steps (heads, the backbone's output head on the drafts, sampling)."
        ),
        "",
        (
            "| heads | decoding | 1st-round acceptance | passes / image | fewer than AR | seconds / image | speedup | "
            "drafting | Fréchet | vs AR's Fréchet | adherence | vs AR (paired) | acceptance per round |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        first = f"{r['acceptance'][0]:.2f}" if r["acceptance"] else "-"
        lines.append(
            f"| {r['heads']} | {r['decoding']} | {first} | {r['passes']:.0f} | {ar['passes'] / r['passes']:.1f}x | "
            f"{r['seconds']:.3f} | {ar['seconds'] / r['seconds']:.1f}x | {100 * r['drafting']:.0f}% | "
            f"{r['frechet']:.0f} | {r['frechet'] / ar['frechet']:.1f}x | {r['adherence']:.3f} | {r['versus']} | "
            f"{format_rates(r['acceptance'])} |"
        )
    return lines


def acceptance_and_frechet(rows: list[dict], out: Path) -> None:
    """Two panels against passes per image: first-round acceptance, and Fréchet distance (AR as a line)."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    ar = rows[0]
    markers = {"ssd r=2": "o", "ssd r=1": "s", "ssd W=17 r=4": "D", "ssd W=17 r=6": "v", "exact": "^"}
    heads = list(dict.fromkeys(r["heads"] for r in rows[1:]))
    colours = {label: plt.get_cmap("tab10")(i) for i, label in enumerate(heads)}
    for r in rows[1:]:
        style = {"color": colours[r["heads"]], "marker": markers[r["decoding"]], "linestyle": ""}
        left.plot(r["passes"], r["acceptance"][0], **style)
        right.plot(r["passes"], r["frechet"], **style)
    right.axhline(ar["frechet"], color="black", linewidth=1, label=f"ar ({ar['passes']:.0f} passes)")
    for label in heads:
        left.plot([], [], color=colours[label], marker="o", linestyle="", label=label)
    for decoding, marker in markers.items():
        right.plot([], [], color="grey", marker=marker, linestyle="", label=decoding)
    left.set(xlabel="passes / image", ylabel="first-round acceptance", title="acceptance (higher is better)")
    right.set(xlabel="passes / image", ylabel="Fréchet distance", yscale="log", title="the look (lower is better)")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
