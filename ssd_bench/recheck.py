"""`exact`'s re-checks: which proposal a cell should carry after the cell to its left was resampled.

In `exact` (docs/decoding.md, "Lossless") a cell verified in a pass keeps its code with q set to that pass's
target p: its code is a sample of p. When the same pass resampled the cell to its left, the next pass checks
the cell against a new target, conditioned on the new left code, and the stale p is accepted with probability
sum_k min(p_old, p_new). Rejections then come in chains along the row. An in-row drafter reads the codes to a
cell's left, so the change it predicts can correct the stale target:

    q' = norm(p_old * (q_draft(. | new left) / q_draft(. | old left)) ** beta)

Any q keeps `exact` lossless as long as the cell's code is a sample of it. This measures each proposal's
acceptance against the backbone's new target, on AR's own grids of held-out prompts, at cells (y >= 1,
x >= left_codes) whose left neighbour is redrawn from its p without the code it had (as a rejection redraws it).
Every set of heads sees the same grids, cells and redraws; the backbone's targets are exact, not sampled.

    ssd-bench recheck --heads "recurrent=runs/h"     # prints the table, writes docs/exact_recheck.md
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from ssd_pipelines.backbones.base import ImageBackbone
from ssd_pipelines.decoding import ARDecoding, ExactDecoding
from ssd_pipelines.heads import DraftHeads
from ssd_pipelines.hub import default_model
from ssd_pipelines.pipeline_ssd import SSDAutoregressivePipeline
from ssd_pipelines.reference.captions import captions
from ssd_pipelines.reference.scenes import HELDOUT_SEED_START
from ssd_pipelines.sampling import reweighted, target_probs
from ssd_pipelines.sampling_config import SamplingConfig
from ssd_pipelines.testing.engine_probes import both_branches
from ssd_pipelines.training.distill_data import teacher_forced_hidden

from . import commands, report
from .drafters import parse_heads

BETAS = (1.0, 2.0, 3.0)


@dataclass
class RecheckCells:
    """One AR image and `n` of its cells whose left neighbour was redrawn: what every proposal is scored on."""

    hidden: torch.Tensor  # [B', R, C, d]: the teacher-forced states of the AR grid (B' = 2 with guidance)
    codes: torch.Tensor  # [1, R, C]: the AR grid
    rows: torch.Tensor  # [n]
    cols: torch.Tensor  # [n]
    redrawn: torch.Tensor  # [n]: the new code of cell (row, col - 1)
    p_old: torch.Tensor  # [n, K]: the target of (row, col) under the AR grid
    p_new: torch.Tensor  # [n, K]: its target once (row, col - 1) holds the redrawn code


@torch.no_grad()
def recheck_cells(
    backbone: ImageBackbone,
    prompt: str,
    sampling: SamplingConfig,
    cells: int,
    min_col: int,
    generator: torch.Generator,
) -> RecheckCells:
    """An AR grid for `prompt`, `cells` random cells of it (row >= 1, col >= min_col) and their targets before and
    after the cell to their left is redrawn (one pass over a copy of the grid per cell)."""
    guidance = sampling.uses_guidance
    batch = backbone.encode_prompts([prompt], guidance=guidance)
    codes = ARDecoding().decode(backbone, batch, sampling, generator=generator).codes  # [1, R, C]
    grid_rows, grid_cols = codes.shape[1:]
    if grid_rows < 2 or grid_cols <= min_col:
        raise ValueError(f"a {grid_rows} x {grid_cols} grid has no cell below row 0 with {min_col} codes to its left.")
    hidden = teacher_forced_hidden(backbone, batch, codes)
    p = target_probs(backbone.code_logits(hidden), sampling)[0]  # [R, C, K]
    rows = torch.randint(1, grid_rows, (cells,), generator=generator)
    cols = torch.randint(min_col, grid_cols, (cells,), generator=generator)
    left = p[rows, cols - 1].clone()
    left[torch.arange(cells), codes[0, rows, cols - 1]] = 0  # a rejection redraws a code other than the one it had
    redrawn = torch.multinomial(left / left.sum(-1, keepdim=True), 1, generator=generator)[:, 0]
    changed = codes.repeat(cells, 1, 1)
    changed[torch.arange(cells), rows, cols - 1] = redrawn
    changed_hidden = teacher_forced_hidden(
        backbone, backbone.encode_prompts([prompt] * cells, guidance=guidance), changed
    )
    p_new = target_probs(backbone.code_logits(changed_hidden), sampling)[torch.arange(cells), rows, cols]
    return RecheckCells(hidden, codes, rows, cols, redrawn, p[rows, cols], p_new)


@torch.no_grad()
def drafts(backbone: ImageBackbone, heads: DraftHeads, sampling: SamplingConfig, image: RecheckCells, redrawn: bool):
    """The in-row drafter's q at each cell [n, K], its left codes those of the AR grid, or with the redrawn one. One
    drafter step for all the cells, rows laid out as the backbone's (conditional cells first, then unconditional)."""
    guidance, n = sampling.uses_guidance, len(image.rows)
    branches = image.hidden.shape[0]
    above = both_branches(image.codes[0, image.rows - 1], guidance)  # [B' / B * n, C]
    hidden_above = image.hidden[:, image.rows - 1].flatten(0, 1)  # [B' / B * n, C, d]
    context = heads.row_context(hidden_above, backbone.embed_codes(above))
    context = context[torch.arange(branches * n), image.cols.repeat(branches)]  # each cell's column
    steps = torch.arange(1, heads.config.left_codes + 1)
    left = image.codes[0, image.rows[:, None], image.cols[:, None] - steps]  # [n, L], x - 1 first
    if redrawn:
        left[:, 0] = image.redrawn
    state = image.hidden[:, image.rows, image.cols - 1].flatten(0, 1) if heads.reads_left_state else None
    drafted = heads.draft_step(context, backbone.embed_codes(both_branches(left, guidance)), state)
    return target_probs(backbone.code_logits(drafted.to(image.hidden.dtype)), sampling)


def acceptance(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Probability that a code drawn from q is accepted against target p: sum_k min(q, p), per cell (1 minus their
    total variation)."""
    return torch.minimum(q, p).sum(-1)


def scores(backbone, heads: DraftHeads, sampling: SamplingConfig, image: RecheckCells) -> dict[str, torch.Tensor]:
    """Per cell: each proposal's acceptance against the new target, and how far each model's target moved."""
    q_old, q_new = (drafts(backbone, heads, sampling, image, redrawn) for redrawn in (False, True))
    out = {"stale": acceptance(image.p_old, image.p_new), "drafter": acceptance(q_new, image.p_new)}
    for beta in BETAS:
        out[f"beta={beta:g}"] = acceptance(reweighted(image.p_old, q_old, q_new, beta), image.p_new)
    out["drafter moved"] = 1 - acceptance(q_old, q_new)  # total variation
    out["backbone moved"] = 1 - out["stale"]
    return out


def proposal_rows(backbone, heads: dict[str, DraftHeads], sampling, prompts: list[str], cells: int) -> list[str]:
    """The acceptance of each proposal, one row per heads, all on the same grids, cells and redraws."""
    min_col = max(h.config.left_codes for h in heads.values())
    generator = torch.Generator().manual_seed(0)
    totals: dict[str, dict[str, list[torch.Tensor]]] = {label: {} for label in heads}
    for prompt in tqdm(prompts, desc="recheck: proposals", unit="image"):
        image = recheck_cells(backbone, prompt, sampling, cells, min_col, generator)
        for label, h in heads.items():
            for name, values in scores(backbone, h, sampling, image).items():
                totals[label].setdefault(name, []).append(values)
    names = list(next(iter(totals.values())))
    lines = ["| heads | cells | " + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|"]
    for label, columns in totals.items():
        means = [torch.cat(columns[name]).mean().item() for name in names]
        lines.append(f"| {label} | {len(prompts) * cells} | " + " | ".join(f"{m:.3f}" for m in means) + " |")
    return lines


def passes_rows(backbone, heads: dict[str, DraftHeads], sampling, prompts: list[str]) -> list[str]:
    """`exact` with re-proposals of each power (0: off), one image per prompt, the same seeds for every row, the
    rows interleaved per prompt so that machine noise hits all alike: passes (exact) and seconds (noisy)."""
    powers = (0.0, *BETAS)
    passes = {(label, power): [] for label in heads for power in powers}
    seconds = {key: [] for key in passes}
    for seed, prompt in enumerate(tqdm(prompts, desc="recheck: exact", unit="prompt")):
        batch = backbone.encode_prompts([prompt], guidance=sampling.uses_guidance)
        for (label, power), counts in passes.items():
            strategy = ExactDecoding(heads[label], repropose=power)
            output = strategy.decode(backbone, batch, sampling, generator=torch.Generator().manual_seed(seed))
            seconds[label, power].append(output.stats.seconds)
            counts.append(output.stats.forward_passes)
    cells = backbone.grid.num_cells
    lines = ["| heads | re-proposal power | passes / image | fewer than AR | seconds / image | vs off |"]
    lines.append("|---|---|---|---|---|---|")
    for (label, power), counts in passes.items():
        mean = statistics.mean(counts)
        time_ratio = statistics.mean(seconds[label, 0.0]) / statistics.mean(seconds[label, power])
        lines.append(
            f"| {label} | {'off' if power == 0 else f'{power:g}'} | {mean:.1f} | {cells / mean:.2f}x | "
            f"{statistics.mean(seconds[label, power]):.2f} | {time_ratio:.2f}x |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    args = commands.recheck_parser().parse_args(argv)
    pipe = SSDAutoregressivePipeline.from_pretrained(args.model or default_model(), dtype=torch.float32)
    backbone, sampling = pipe.image_backbone, SamplingConfig(guidance_scale=args.guidance)
    heads = {
        label: DraftHeads.from_pretrained(folder, use_safetensors=True)
        for label, folder in parse_heads(args.heads).items()
    }
    for label, h in heads.items():
        h.check_compatible(backbone)
        if not h.in_row:
            raise SystemExit(f"--heads {label}: a {h.drafter!r} drafter does not read the code to a cell's left.")
    lines = proposal_rows(backbone, heads, sampling, captions(args.prompts, HELDOUT_SEED_START), args.cells)
    lines += [
        "",
        (
            "Acceptance of a cell's proposal against its new target once the cell to its left is redrawn: `stale` is "
            "the old target (`exact` without re-proposals), `drafter` the in-row drafter's q with the new left code, "
            "`beta=b` the old target reweighted by the drafter's predicted change to the power b. `drafter moved` and "
            "`backbone moved`: total variation between each model's distributions before and after the redraw."
        ),
        "",
        *passes_rows(backbone, heads, sampling, captions(args.exact_prompts, HELDOUT_SEED_START)),
        "",
        (
            f"`exact` (window one row) with re-proposals of each power, {args.exact_prompts} held-out prompts, one "
            f"image each, the same seeds in every row. AR takes one pass per code ({backbone.grid.num_cells}). "
            "Seconds: mean of one run each on this machine, rows interleaved; `vs off`: the same heads without "
            "re-proposals over this row's time."
        ),
    ]
    command = f"ssd-bench recheck --prompts {args.prompts} --cells {args.cells} --exact-prompts {args.exact_prompts} "
    command += " ".join(f'--heads "{value}"' for value in args.heads)
    report(lines, args.out, "exact's re-checks: proposals after a left neighbour is redrawn", command)
