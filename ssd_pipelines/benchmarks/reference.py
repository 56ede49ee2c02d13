"""Adherence and speed of each decoding on the reference model, side by side in one run.

Adherence: the held-out prompts (scene seeds from `HELDOUT_SEED_START`) are
generated with every decoding (guidance batched, same seeds) and scored by the
GenEval-style evaluator. Speed: one prompt at a time, the decodings interleaved
and repeated, the median taken; forward passes are exact, seconds are noisy.

    ssd-bench reference          # prints the table, writes docs/reference_benchmark.md
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np
import torch

from ..cli import default_model
from ..pipeline_ssd import SSDAutoregressivePipeline
from ..reference.evaluator import evaluate
from ..reference.scenes import HELDOUT_SEED_START, sample_scene
from . import format_rates, report

DECODINGS: dict[str, dict] = {
    "ar": {"decoding": "ar"},
    "ssd r=0": {"decoding": "ssd", "verify_rounds": 0},
    "ssd r=1": {"decoding": "ssd", "verify_rounds": 1},
    "ssd r=2": {"decoding": "ssd", "verify_rounds": 2},
    "exact": {"decoding": "exact"},
}


def adherence(pipe, label: str, options: dict, scenes, batch_size: int, guidance: float) -> dict:
    """Generate every held-out prompt with one decoding; evaluator accuracy and mean statistics."""
    images, accepted, drafted = [], [], []
    for start in range(0, len(scenes), batch_size):
        chunk = scenes[start : start + batch_size]
        out = pipe(
            [s.caption for s in chunk],
            guidance_scale=guidance,
            generator=torch.Generator().manual_seed(start),
            output_type="np",
            **options,
        )
        images += list((out.images * 255).round().astype("uint8"))
        accepted.append(out.stats["accepted_per_round"])
        drafted.append(out.stats["drafted_per_round"])
    rounds = max(map(len, drafted))
    acceptance = [
        sum(a[k] for a in accepted if k < len(a)) / max(1, sum(d[k] for d in drafted if k < len(d)))
        for k in range(rounds)
    ]
    report = evaluate(images, [s.spec for s in scenes])
    return {"label": label, "adherence": report["overall"], "results": report["results"], "acceptance": acceptance}


def paired_difference(results: list[dict], baseline: list[dict]) -> tuple[float, float]:
    """Adherence difference to the baseline on the same prompts, and its standard error.

    Adherence is the mean of per-task accuracies, so the difference is the mean of
    per-task mean paired differences (pass - pass per prompt), and its variance the
    sum of their variances over the number of tasks squared.
    """
    by_task: dict[str, list[int]] = {}
    for ours, theirs in zip(results, baseline, strict=True):
        by_task.setdefault(ours["task"], []).append(int(ours["passed"]) - int(theirs["passed"]))
    diffs = [np.asarray(d, dtype=float) for d in by_task.values()]
    mean = float(np.mean([d.mean() for d in diffs]))
    variance = sum(d.var(ddof=1) / len(d) if len(d) > 1 else 0.0 for d in diffs) / len(diffs) ** 2
    return mean, float(np.sqrt(variance))


def latency(pipe, scenes, repeats: int, guidance: float) -> dict[str, dict]:
    """Median seconds and passes for one image, every decoding run in turn on the same prompt and seed."""
    seconds: dict[str, list[float]] = {label: [] for label in DECODINGS}
    passes: dict[str, int] = {}
    pipe("warm up", decoding="ar", guidance_scale=guidance, output_type="latent")
    for repeat in range(repeats):
        prompt = scenes[repeat % len(scenes)].caption
        for label, options in DECODINGS.items():
            out = pipe(
                prompt,
                guidance_scale=guidance,
                generator=torch.Generator().manual_seed(repeat),
                output_type="latent",
                **options,
            )
            seconds[label].append(out.stats["seconds"])
            passes[label] = out.stats["forward_passes"]
    return {label: {"seconds": statistics.median(s), "passes": passes[label]} for label, s in seconds.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="pipeline folder or repository (default: the reference model)")
    parser.add_argument("--prompts", type=int, default=200, help="held-out prompts scored per decoding")
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5, help="single-image timings per decoding (median)")
    parser.add_argument("--guidance", type=float, default=3.0)
    parser.add_argument("--out", type=Path, default=Path("docs/reference_benchmark.md"))
    args = parser.parse_args(argv)

    pipe = SSDAutoregressivePipeline.from_pretrained(args.model or default_model(), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    scenes = [sample_scene(HELDOUT_SEED_START + i) for i in range(args.prompts)]
    quality = [adherence(pipe, label, o, scenes, args.batch_size, args.guidance) for label, o in DECODINGS.items()]
    speed = latency(pipe, scenes, args.repeats, args.guidance)
    ar = speed["ar"]
    lines = [
        (
            f"Reference model, {args.prompts} held-out prompts, guidance {args.guidance} (batched in every decoding), "
            f"temperature 1; latency: one image, median of {args.repeats}, decodings interleaved, "
            f"{torch.get_num_threads()} CPU threads."
        ),
        "",
        (
            "| decoding | adherence | vs AR (paired, +- s.e.) | passes / image | fewer passes than AR | "
            "seconds / image | speedup | acceptance per round |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    baseline = quality[0]["results"]
    for q in quality:
        s = speed[q["label"]]
        diff, se = paired_difference(q["results"], baseline)
        versus = "-" if q["results"] is baseline else f"{diff:+.3f} +- {se:.3f}"
        lines.append(
            f"| {q['label']} | {q['adherence']:.3f} | {versus} | {s['passes']} | {ar['passes'] / s['passes']:.1f}x | "
            f"{s['seconds']:.3f} | {ar['seconds'] / s['seconds']:.1f}x | {format_rates(q['acceptance'])} |"
        )
    report(lines, args.out, "Reference model: adherence and speed", "ssd-bench reference")


if __name__ == "__main__":
    main()
