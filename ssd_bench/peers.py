"""SSD against AR and the published peers, in one run on the reference model: speed, quality and scaling.

Every strategy runs on the same backbone, machine and run, its calls interleaved
with the others' so that machine noise hits all alike:

1. Speed: for batch sizes 1 to 64, each strategy decodes held-out prompts in
   turn (repeated, median taken); past batch 8, only until it has been slower
   than AR at two sizes in a row (speculative decoding trades compute for
   latency, so it only falls further behind). Forward passes and tokens are
   exact; seconds are not.
2. Quality: the same held-out prompts and seeds under every strategy; adherence
   per GenEval task, the Fréchet distance of the scene classifier's features to
   real renders of held-out captions (the prompts' own among them), and the
   token distance to AR's codes.
3. Scaling: forward passes against grid side n on random-weight backbones,
   with perfect and with random drafts.

    ssd-bench peers          # about 20 minutes on 2 quiet CPU cores -> docs/benchmarks.md and its figures
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics

import numpy as np
import torch
from tqdm import tqdm

from ssd_pipelines.acceptance import format_rates
from ssd_pipelines.decoding import make_strategy
from ssd_pipelines.hub import default_model
from ssd_pipelines.pipeline_ssd import SSDAutoregressivePipeline
from ssd_pipelines.plots import image_grid
from ssd_pipelines.reference.quality import frechet_distance, heldout_features, image_features, load_quality_net
from ssd_pipelines.reference.scenes import HELDOUT_SEED_START, sample_scene
from ssd_pipelines.sampling_config import SamplingConfig
from ssd_pipelines.vq import encode_images

from . import commands, plots, report
from .image_quality import generate, judge, to_uint8
from .measure_run import release_freed_memory, run_once
from .scaling import pass_counts

STRATEGIES: dict[str, tuple[str, dict]] = {
    "ar": ("ar", {}),
    **{
        f"ssd r={r}" + ("" if rows == 1 else " k_v=2"): ("ssd", {"verify_rounds": r, "vertical_rows": rows})
        for rows in (1, 2)
        for r in range(4)
    },
    "exact": ("exact", {}),
    "sjd": ("sjd", {}),
    "sjd-pac": ("sjd-pac", {}),
    "gsd": ("gsd", {}),
    "zipar": ("zipar", {}),
    "mtp1d": ("mtp1d", {}),
}
# Lossless: sample exactly the AR distribution (tests/test_peers.py, tests/test_decoding_distribution.py).
LOSSLESS = {"ar", "exact", "sjd", "sjd-pac", "mtp1d"}
GRID_PROMPTS = 6  # prompts in the image grid (each with all its images)


def repeats_at(batch: int, repeats: int) -> int:
    """Timed calls per strategy at a batch size: `repeats` up to batch 8, fewer for larger batches."""
    return max(1, repeats * 8 // max(batch, 8))


def speed(pipe, captions, sampling, sizes, repeats) -> dict[str, dict[int, dict]]:
    """label -> batch size -> median seconds per image, passes and tokens per image, peak bytes."""
    backbone = pipe.image_backbone
    strategies = {label: make_strategy(name, pipe.heads, **o) for label, (name, o) in STRATEGIES.items()}
    calls = {label: {} for label in strategies}
    active, behind = list(strategies), dict.fromkeys(strategies, 0)
    planned = sum(repeats_at(b, repeats) * len(strategies) for b in sizes) + len(strategies)
    with tqdm(total=planned, desc="speed", unit="call") as progress:
        for label, strategy in strategies.items():  # warm-up, untimed
            run_once(strategy, backbone, captions[:1], sampling, seed=0)
            progress.update()
        for b in sizes:
            costs = {label: [] for label in active}
            for rep in range(repeats_at(b, repeats)):
                prompts = [captions[(rep * b + i) % len(captions)] for i in range(b)]
                for label in active:
                    costs[label].append(run_once(strategies[label], backbone, prompts, sampling, seed=rep))
                    progress.update()
            for label, runs in costs.items():
                calls[label][b] = {
                    "seconds": statistics.median(c.seconds / b for c in runs),
                    "passes": statistics.mean(c.passes for c in runs),
                    "tokens": statistics.mean(c.tokens for c in runs),
                    "peak": max((c.peak_bytes or 0) for c in runs) if runs[0].peak_bytes is not None else None,
                }
            ar = calls["ar"][b]["seconds"]
            for label in list(active):
                behind[label] = behind[label] + 1 if calls[label][b]["seconds"] >= ar and label != "ar" else 0
                if behind[label] >= 2 and b >= 8:  # slower than AR at two sizes in a row: it only falls behind
                    active.remove(label)
                    later = [s for s in sizes if s > b]
                    progress.total -= sum(repeats_at(s, repeats) for s in later)
                    progress.refresh()
    return calls


def crossover(calls: dict[int, dict], ar: dict[int, dict]) -> str:
    """Where a strategy stops beating AR in seconds per image."""
    if calls is ar:
        return "-"
    slower = [b for b in sorted(calls) if calls[b]["seconds"] >= ar[b]["seconds"]]
    if not slower:
        return f"beats AR at every size measured (to {max(calls)})"
    if slower[0] == min(calls):
        return f"slower than AR from batch {slower[0]}"
    faster = [b for b in sorted(calls) if b < slower[0]]
    return f"beats AR up to batch {faster[-1]}, not from {slower[0]}"


def quality(pipe, scenes, images_per_prompt, batch_size, sampling, net, reference) -> dict[str, dict]:
    """label -> the generated set and its adherence, Fréchet distance and token distance to AR."""
    backbone = pipe.image_backbone
    sets = {}
    total = len(STRATEGIES) * len(scenes) * images_per_prompt
    with tqdm(total=total, desc="quality", unit="image") as progress:
        for label, (name, options) in STRATEGIES.items():
            strategy = make_strategy(name, pipe.heads, **options)
            sets[label] = generate(
                strategy, backbone, scenes, images_per_prompt, batch_size, sampling, on_call=progress.update
            )
    codebook = backbone.grid.codebook_size
    return {
        label: {
            "set": generated,
            "quality": judge(generated, scenes, images_per_prompt, net, reference, sets["ar"].codes, codebook),
        }
        for label, generated in sets.items()
    }


def real_reference(pipe, net, renders: int, compared: int) -> tuple[np.ndarray, dict[str, float]]:
    """Features of real renders of the first `renders` held-out captions (the prompts' own among them), and two
    floors of the measure: the Fréchet distance to them of `compared` real renders of other held-out scenes, and
    of the same renders through the VQ tokenizer (encoded to codes and decoded), the best any decoding can do."""
    reference = heldout_features(net, renders)
    others = np.stack([sample_scene(HELDOUT_SEED_START + 500_000 + i).image for i in range(compared)])
    round_trip = to_uint8(pipe.image_backbone.decode_codes(encode_images(pipe.vqvae, others)))
    floors = {
        "real": frechet_distance(image_features(net, others), reference),
        "tokenizer": frechet_distance(image_features(net, round_trip), reference),
    }
    return reference, floors


def main(argv: list[str] | None = None) -> None:
    args = commands.peers_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    release_freed_memory()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    started = datetime.datetime.now()

    pipe = SSDAutoregressivePipeline.from_pretrained(args.model or default_model(), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    sampling = SamplingConfig(temperature=1.0, guidance_scale=args.guidance)
    scenes = [sample_scene(HELDOUT_SEED_START + i) for i in range(args.prompts)]
    net = load_quality_net()
    reference, floors = real_reference(
        pipe, net, max(args.reference_renders, args.prompts), args.prompts * args.images_per_prompt
    )

    calls = speed(pipe, [s.caption for s in scenes], sampling, sorted(args.batch_sizes), args.repeats)
    judged = quality(pipe, scenes, args.images_per_prompt, args.quality_batch, sampling, net, reference)
    with tqdm(total=len(STRATEGIES) * len(args.sides) * 2, desc="scaling", unit="run") as progress:
        scaling = pass_counts(STRATEGIES, tuple(args.sides), on_run=progress.update)

    out_dir = args.out.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = {
        name: out_dir / f"benchmarks_{name}.png" for name in ("speed_quality", "throughput", "scaling", "images")
    }
    rows = summary_rows(calls, judged, floors["real"])
    plots.speed_quality(rows, figures["speed_quality"])
    plots.throughput(
        {label: {b: c["seconds"] for b, c in per.items()} for label, per in calls.items()}, figures["throughput"]
    )
    plots.scaling(scaling, figures["scaling"])
    grid_images = {label: j["set"].images[: GRID_PROMPTS * args.images_per_prompt] for label, j in judged.items()}
    image_grid(
        grid_images,
        [s.caption for s in scenes[:GRID_PROMPTS] for _ in range(args.images_per_prompt)],
        figures["images"],
    )

    minutes = (datetime.datetime.now() - started).total_seconds() / 60
    machine = (
        f"{platform.machine()} CPU, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, torch "
        f"{torch.__version__}; load average {load:.1f} at the start"
        + (f"; {args.note}" if args.note else "")
        + f". Run {started:%Y-%m-%d %H:%M}, {minutes:.0f} minutes."
    )
    lines = render(rows, calls, judged, scaling, args, machine, floors, figures)
    report(lines, args.out, "SSD against AR and the published peers", "ssd-bench peers")


def summary_rows(calls, judged, floor) -> list[dict]:
    """One dict per strategy with the numbers the tables and the scatter plot show."""
    rows = []
    for label in STRATEGIES:
        q = judged[label]["quality"]
        rows.append(
            {
                "label": label,
                "lossless": label in LOSSLESS,
                "passes": calls[label][1]["passes"],
                "tokens": calls[label][1]["tokens"],
                "seconds_1": calls[label][1]["seconds"],
                "seconds_8": calls[label].get(8, {}).get("seconds"),
                "peak_8": calls[label].get(8, {}).get("peak"),
                "acceptance": judged[label]["set"].acceptance,
                "adherence": q.adherence,
                "per_task": q.per_task,
                "frechet": q.frechet,
                "token_distance": q.token_distance,
                "floor": floor,
                "crossover": crossover(calls[label], calls["ar"]),
            }
        )
    return rows


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{b / a:.1f}x"


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}"


def render(rows, calls, judged, scaling, args, machine, floors, figures) -> list[str]:
    """The report: tables, targets and figures."""
    by_label = {row["label"]: row for row in rows}
    ar, sjd = by_label["ar"], by_label["sjd"]
    n_images = args.prompts * args.images_per_prompt
    lines = [
        (
            f"Reference model (16 x 16 codes, 64 x 64 pixels), guidance {args.guidance} batched in every strategy, "
            f"temperature 1. {machine}"
        ),
        "",
        "## Speed and quality",
        "",
        (
            "Passes and tokens: per image at batch 1 (tokens: image positions run through the backbone). Seconds: "
            f"median per image, strategies interleaved, {args.repeats} calls per strategy up to batch 8. Peak: "
            "memory the call allocated above what was live before it, at batch 8 (MiB; resident set on CPU). "
            "Acceptance: drafted cells kept at each cell's 1st, 2nd, 3rd verification. Quality on "
            f"{args.prompts} held-out prompts x {args.images_per_prompt} images, {args.quality_batch} images a call, "
            f"the same seeds for every strategy; Fréchet distance to {args.reference_renders} real renders of held-out "
            f"captions (floors: real renders of other held-out scenes {floors['real']:.0f}; the same renders through "
            f"the VQ tokenizer, encoded and decoded, {floors['tokenizer']:.0f}); token distance: total variation "
            "between the strategy's and AR's code frequencies."
        ),
        "",
        (
            "| strategy | lossless | passes | tokens | s/img b=1 | s/img b=8 | vs AR b=1 / b=8 | vs SJD b=1 / b=8 | "
            "acceptance | peak MiB b=8 | adherence | Fréchet | token TV to AR |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s8 = "-" if r["seconds_8"] is None else f"{r['seconds_8']:.3f}"
        lines.append(
            f"| {r['label']} | {'yes' if r['lossless'] else 'no'} | {r['passes']:.0f} | {r['tokens']:.0f} | "
            f"{r['seconds_1']:.3f} | {s8} | {_ratio(r['seconds_1'], ar['seconds_1'])} / "
            f"{_ratio(r['seconds_8'], ar['seconds_8'])} | {_ratio(r['seconds_1'], sjd['seconds_1'])} / "
            f"{_ratio(r['seconds_8'], sjd['seconds_8'])} | {format_rates(r['acceptance'][:3])} | "
            f"{_mib(r['peak_8'])} | {r['adherence']:.3f} | {r['frechet']:.0f} | {r['token_distance']:.3f} |"
        )
    tasks = list(rows[0]["per_task"])
    lines += [
        "",
        f"Adherence per GenEval task ({n_images} images per strategy; the overall adherence is their mean):",
        "",
        "| strategy | " + " | ".join(tasks) + " |",
        "|---|" + "---|" * len(tasks),
        *[f"| {r['label']} | " + " | ".join(f"{r['per_task'][t]:.2f}" for t in tasks) + " |" for r in rows],
        "",
        "## Throughput against batch size",
        "",
        (
            "Seconds per image; past batch 8 a strategy stops being measured once it has been slower than AR at two "
            "sizes in a row. Speculative decoding spends compute to save passes: once a batch fills the machine, the "
            "extra tokens cost more than the passes saved."
        ),
        "",
        "| strategy | " + " | ".join(f"b={b}" for b in sorted(args.batch_sizes)) + " | where it stops beating AR |",
        "|---|" + "---|" * (len(args.batch_sizes) + 1),
    ]
    for r in rows:
        per = calls[r["label"]]
        cells = [f"{per[b]['seconds']:.3f}" if b in per else "-" for b in sorted(args.batch_sizes)]
        lines.append(f"| {r['label']} | " + " | ".join(cells) + f" | {r['crossover']} |")
    lines += ["", "## Targets", "", *targets(by_label), "", "## Scaling", ""]
    lines += [
        (
            "Forward passes per image against grid side n (n x n codes with end-of-line tokens, codebook 16), "
            "random-weight backbones, guidance 2, temperature 1, 2 images a call (see `ssd_bench/scaling.py` for "
            "what perfect and random drafts mean)."
        ),
        "",
    ]
    for setting, per_label in scaling.items():
        sides = sorted(next(iter(per_label.values())))
        lines += [
            f"{setting}:",
            "",
            "| strategy | " + " | ".join(f"n={n}" for n in sides) + " |",
            "|---|" + "---|" * len(sides),
            *[
                f"| {label} | " + " | ".join(f"{curve[n]:.0f}" for n in sides) + " |"
                for label, curve in per_label.items()
            ],
            "",
        ]
    lines += [
        "## Figures",
        "",
        f"![speed against quality]({figures['speed_quality'].name})",
        "",
        f"![throughput against batch size]({figures['throughput'].name})",
        "",
        f"![passes against grid side]({figures['scaling'].name})",
        "",
        (
            f"The first {GRID_PROMPTS} prompts of the quality run, {args.images_per_prompt} images each, under every "
            "strategy (same prompts and seeds):"
        ),
        "",
        f"![the same prompts under every strategy]({figures['images'].name})",
    ]
    return lines


def targets(by_label: dict[str, dict]) -> list[str]:
    """The issue's targets, met or missed, from this run's numbers."""
    ssd, sjd, pac = by_label["ssd r=1"], by_label["sjd"], by_label["sjd-pac"]
    lines = []
    for peer, need in ((sjd, 2.0), (pac, 1.5)):
        for b, key in ((1, "seconds_1"), (8, "seconds_8")):
            if ssd[key] is None or peer[key] is None:
                continue
            ratio = peer[key] / ssd[key]
            verdict = "met" if ratio >= need else "missed"
            lines.append(
                f"- `ssd` r=1 {ratio:.1f}x faster than `{peer['label']}` at batch {b} (target {need}x): {verdict}."
            )
    for peer in (by_label["zipar"], by_label["mtp1d"]):
        fewer = ssd["passes"] <= peer["passes"]
        better = ssd["frechet"] < peer["frechet"]
        verdict = "met" if fewer and better else "missed"
        lines.append(
            f"- `ssd` r=1 Fréchet {ssd['frechet']:.0f} at {ssd['passes']:.0f} passes against `{peer['label']}` "
            f"{peer['frechet']:.0f} at {peer['passes']:.0f} passes (target: better at equal or fewer passes): {verdict}."
        )
    exact = by_label["exact"]
    lines.append(
        f"- For comparison, SSD's lossless mode: `exact` Fréchet {exact['frechet']:.0f} (AR {by_label['ar']['frechet']:.0f})"
        f" at {exact['passes']:.0f} passes."
    )
    return lines


if __name__ == "__main__":
    main()
