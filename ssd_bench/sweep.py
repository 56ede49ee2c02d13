"""AR adherence of the reference model under several sampling settings, side by side.

Which guidance scale, temperature or top-k makes the model follow its prompts
best, and which of several trained models does: each setting, on each model, generates
the same held-out prompts with the same seeds, and is compared with the first by the
paired difference `ssd-bench reference` uses. The Fréchet distance of `ssd-bench peers`
(to real renders of held-out captions) says whether the images themselves got better.

    ssd-bench sweep                                  # the default settings -> docs/reference_sweep.md
    ssd-bench sweep --setting guidance=3 --setting guidance=5,top_k=50
    ssd-bench sweep --model hub_cards/ssd-reference --model runs/candidate --setting guidance=3 --out runs/vs.md
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from ssd_pipelines.hub import default_model
from ssd_pipelines.pipeline_ssd import SSDAutoregressivePipeline
from ssd_pipelines.reference.quality import frechet_to_heldout
from ssd_pipelines.reference.scenes import HELDOUT_SEED_START, sample_scene

from . import commands, report
from .reference import adherence, per_task_table, versus_baseline

DEFAULT_SETTINGS = [
    "guidance=3",
    "guidance=1.5",
    "guidance=5",
    "guidance=7",
    "guidance=3,temperature=0.8",
    "guidance=3,top_k=50",
]


def describe(setting: dict) -> str:
    return f"{setting['guidance']:g} | {setting['temperature']:g} | {setting['top_k'] or '-'}"


def main(argv: list[str] | None = None) -> None:
    parser = commands.sweep_parser()
    args = parser.parse_args(argv)
    settings = args.setting or [commands.sweep_setting(text) for text in DEFAULT_SETTINGS]

    models = args.model or [default_model()]
    scenes = [sample_scene(HELDOUT_SEED_START + i) for i in range(args.prompts)]
    scores = []
    total = len(models) * len(settings) * len(scenes) * args.images_per_prompt
    with tqdm(total=total, desc="sweep", unit="image") as progress:
        for model in models:
            pipe = SSDAutoregressivePipeline.from_pretrained(model, dtype=torch.float32)
            pipe.set_progress_bar_config(disable=True)
            for setting in settings:
                options = {"decoding": "ar", "temperature": setting["temperature"], "top_k": setting["top_k"] or None}
                label = describe(setting) if len(models) == 1 else f"{model} | {describe(setting)}"
                scores.append(
                    adherence(
                        pipe,
                        label,
                        options,
                        scenes,
                        args.images_per_prompt,
                        args.batch_size,
                        setting["guidance"],
                        progress,
                    )
                )
    head = ("model | " if len(models) > 1 else "") + "guidance | temperature | top-k"
    lines = [
        f"AR decoding, {args.prompts} held-out prompts, {args.images_per_prompt} image(s) each, the same seeds.",
        "",
        f"| {head} | adherence | vs first row (paired, +- s.e.) | Fréchet |",
        "|" + "---|" * (head.count("|") + 4),
    ]
    frechets = frechet_to_heldout([score["images"] for score in scores], args.reference_renders)
    baseline = scores[0]["results"]
    for score, frechet in zip(scores, frechets):
        versus = versus_baseline(score["results"], baseline, args.images_per_prompt)
        lines.append(f"| {score['label']} | {score['adherence']:.3f} | {versus} | {frechet:.0f} |")
    lines += ["", "Adherence per task:", "", *per_task_table(scores, head)]
    report(lines, args.out, "Reference model: adherence under sampling settings", "ssd-bench sweep")


if __name__ == "__main__":
    main()
