"""Adherence and speed of each decoding on the reference model, side by side in one run.

Adherence: the held-out prompts (scene seeds from `HELDOUT_SEED_START`) are
generated with every decoding (guidance batched, same seeds), several images per
prompt as GenEval does, and scored by the GenEval-style evaluator. Speed: one
prompt at a time, the decodings interleaved and repeated, the median taken;
forward passes are exact, seconds are noisy. Below the table, the run names the
default it argues for: the decoding with the fewest passes whose Fréchet distance
is within `FRECHET_BUDGET` of AR's and whose adherence is within
`ADHERENCE_BUDGET` (`choose_default`).

    ssd-bench reference          # prints the table, writes docs/reference_benchmark.md
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm import tqdm

from ssd_pipelines.acceptance import format_rates
from ssd_pipelines.hub import default_model
from ssd_pipelines.pipeline_ssd import SSDAutoregressivePipeline
from ssd_pipelines.reference.evaluator import evaluate
from ssd_pipelines.reference.quality import frechet_to_heldout
from ssd_pipelines.reference.scenes import HELDOUT_SEED_START, sample_scene

from . import commands, report
from .measure_run import one_image_call, summarize_calls

DECODINGS: dict[str, dict] = {
    "ar": {"decoding": "ar"},
    "ssd r=0": {"decoding": "ssd", "verify_rounds": 0},
    "ssd r=1": {"decoding": "ssd", "verify_rounds": 1},
    "ssd r=2": {"decoding": "ssd", "verify_rounds": 2},
    "ssd W=17 r=4": {"decoding": "ssd", "verify_rounds": 4, "window": 17},  # pipelined on one row (17 positions)
    "ssd W=17 r=6": {"decoding": "ssd", "verify_rounds": 6, "window": 17},
    "exact": {"decoding": "exact"},
}
FRECHET_BUDGET = 1.5  # a default may draw a Fréchet distance up to this multiple of AR's
ADHERENCE_BUDGET = 0.03  # and lose at most this much adherence against AR (paired)


def choose_default(rows: list[dict]) -> str:
    """The sentence naming the default this run argues for, from rows (label, passes, frechet, and adherence_diff
    against AR; AR's first): the fewest passes among the decodings that keep AR's look (Fréchet distance within
    FRECHET_BUDGET of AR's) and its prompt-following (adherence within ADHERENCE_BUDGET). Both: a decoding that
    draws stray fragments can keep the Fréchet distance and still miss the colours and counts."""
    ar, others = rows[0], rows[1:]
    budget = FRECHET_BUDGET * ar["frechet"]
    within = [r for r in others if r["frechet"] <= budget and abs(r["adherence_diff"]) <= ADHERENCE_BUDGET]
    rule = (
        f"the fewest passes whose Fréchet distance is within {FRECHET_BUDGET}x of AR's ({budget:.0f}) and whose "
        f"adherence is within {ADHERENCE_BUDGET} of AR's"
    )
    if not within:
        return f"Default by this run's rule ({rule}): none qualifies."
    best = min(within, key=lambda r: r["passes"])
    return f"Default by this run's rule ({rule}): **{best['label']}**, {best['passes']:.0f} passes."


def adherence(
    pipe, label: str, options: dict, scenes, images_per_prompt: int, batch_size: int, guidance: float, progress=None
) -> dict:
    """Generate every held-out prompt with one decoding; evaluator accuracy and mean statistics.

    `batch_size` counts images per pipeline call; results are prompt-major. `progress` (a tqdm bar) advances by
    the images of each call.
    """
    images, accepted, drafted = [], [], []
    prompts_per_call = max(1, batch_size // images_per_prompt)
    for start in range(0, len(scenes), prompts_per_call):
        chunk = scenes[start : start + prompts_per_call]
        out = pipe(
            [s.caption for s in chunk],
            num_images_per_prompt=images_per_prompt,
            guidance_scale=guidance,
            generator=torch.Generator().manual_seed(start),
            output_type="np",
            **options,
        )
        images += list((out.images * 255).round().astype("uint8"))
        if progress is not None:
            progress.update(len(chunk) * images_per_prompt)
        accepted.append(out.stats["accepted_per_round"])
        drafted.append(out.stats["drafted_per_round"])
    rounds = max(map(len, drafted))
    acceptance = [
        sum(a[k] for a in accepted if k < len(a)) / max(1, sum(d[k] for d in drafted if k < len(d)))
        for k in range(rounds)
    ]
    report = evaluate(images, [s.spec for s in scenes for _ in range(images_per_prompt)])
    return {
        "label": label,
        "adherence": report["overall"],
        "per_task": report["per_task"],
        "results": report["results"],
        "acceptance": acceptance,
        "images": images,
    }


def paired_difference(results: list[dict], baseline: list[dict], images_per_prompt: int = 1) -> tuple[float, float]:
    """Adherence difference to the baseline on the same prompts, and its standard error.

    Adherence is the mean of per-task accuracies, so the difference is the mean of
    per-task mean paired differences (pass - pass per prompt, averaged over the
    prompt's images, which are not independent of each other), and its variance
    the sum of their variances over the number of tasks squared.
    """
    by_task: dict[str, list[float]] = {}
    pairs = list(zip(results, baseline, strict=True))
    for start in range(0, len(pairs), images_per_prompt):
        prompt = pairs[start : start + images_per_prompt]
        diff = np.mean([int(ours["passed"]) - int(theirs["passed"]) for ours, theirs in prompt])
        by_task.setdefault(prompt[0][0]["task"], []).append(diff)
    diffs = [np.asarray(d, dtype=float) for d in by_task.values()]
    mean = float(np.mean([d.mean() for d in diffs]))
    variance = sum(d.var(ddof=1) / len(d) if len(d) > 1 else 0.0 for d in diffs) / len(diffs) ** 2
    return mean, float(np.sqrt(variance))


def versus_baseline(results: list[dict], baseline: list[dict], images_per_prompt: int) -> str:
    """The table cell for `paired_difference`: "-" for the baseline's own row."""
    if results is baseline:
        return "-"
    diff, se = paired_difference(results, baseline, images_per_prompt)
    return f"{diff:+.3f} +- {se:.3f}"


def per_task_table(quality: list[dict], head: str = "decoding") -> list[str]:
    """One row per decoding (or what `head` names, its columns joined by " | "), one column per GenEval task:
    where adherence is lost."""
    tasks = list(quality[0]["per_task"])
    lines = [f"| {head} | " + " | ".join(tasks) + " |", "|" + "---|" * (head.count("|") + 1 + len(tasks))]
    for q in quality:
        lines.append(f"| {q['label']} | " + " | ".join(f"{q['per_task'][t]:.3f}" for t in tasks) + " |")
    return lines


def latency(pipe, scenes, repeats: int, guidance: float) -> dict[str, dict]:
    """Median seconds, mean passes and the median share of time spent drafting for one image, every decoding run
    in turn on the same prompt and seed."""
    calls: dict[str, list[dict]] = {label: [] for label in DECODINGS}
    pipe(scenes[0].caption, decoding="ar", guidance_scale=guidance, output_type="latent")  # warm-up, untimed
    with tqdm(total=repeats * len(DECODINGS), desc="latency", unit="call") as progress:
        for repeat in range(repeats):
            prompt = scenes[repeat % len(scenes)].caption
            for label, options in DECODINGS.items():
                calls[label].append(one_image_call(pipe, prompt, guidance, repeat, options))
                progress.update()
    return {label: summarize_calls(c) for label, c in calls.items()}


def main(argv: list[str] | None = None) -> None:
    args = commands.reference_parser().parse_args(argv)

    pipe = SSDAutoregressivePipeline.from_pretrained(args.model or default_model(), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    scenes = [sample_scene(HELDOUT_SEED_START + i) for i in range(args.prompts)]
    with tqdm(total=len(DECODINGS) * len(scenes) * args.images_per_prompt, desc="adherence", unit="image") as bar:
        quality = [
            adherence(pipe, label, o, scenes, args.images_per_prompt, args.batch_size, args.guidance, bar)
            for label, o in DECODINGS.items()
        ]
    speed = latency(pipe, scenes, args.repeats, args.guidance)
    ar = speed["ar"]
    lines = [
        (
            f"Reference model, {args.prompts} held-out prompts x {args.images_per_prompt} images, "
            f"guidance {args.guidance} (batched in every decoding), "
            f"temperature 1; latency: one image, median of {args.repeats}, decodings interleaved, "
            f"{torch.get_num_threads()} CPU threads. Drafting: the share of a one-image call spent in the drafting "
            "steps (heads, the backbone's output head on the drafts, sampling)."
        ),
        "",
        (
            "| decoding | adherence | vs AR (paired, +- s.e.) | Fréchet | passes / image | fewer passes than AR | "
            "seconds / image | speedup | drafting | acceptance per round |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    frechets = frechet_to_heldout([q["images"] for q in quality], args.reference_renders)
    baseline = quality[0]["results"]
    for q, frechet in zip(quality, frechets):
        s = speed[q["label"]]
        versus = versus_baseline(q["results"], baseline, args.images_per_prompt)
        lines.append(
            f"| {q['label']} | {q['adherence']:.3f} | {versus} | {frechet:.0f} | {s['passes']:.0f} | "
            f"{ar['passes'] / s['passes']:.1f}x | {s['seconds']:.3f} | {ar['seconds'] / s['seconds']:.1f}x | "
            f"{100 * s['drafting']:.0f}% | {format_rates(q['acceptance'])} |"
        )
    rows = [
        {
            "label": q["label"],
            "frechet": f,
            "adherence_diff": paired_difference(q["results"], baseline, args.images_per_prompt)[0],
            **speed[q["label"]],
        }
        for q, f in zip(quality, frechets)
    ]
    lines += [
        "",
        choose_default(rows),
        "",
        "Adherence per task (the overall adherence is their mean, as in GenEval):",
        "",
        *per_task_table(quality),
    ]
    report(lines, args.out, "Reference model: adherence and speed", "ssd-bench reference")


if __name__ == "__main__":
    main()
