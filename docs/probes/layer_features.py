"""Probe (a record, not part of the package): does the recurrent drafter take more drafts when it also reads middle
layers of the row above (EAGLE-3, FlashAR), not only the last layer's state?

Teacher-forced, on a distillation collection (`--data-dir` of `ssd_pipelines.training.distill`, its prompts file):
the middle layers' states come from one pass over each shard's codes, hooks on the decoder layers. The drafter reads
h' = h_last + W_f [h_a; h_b] where it reads h (W_f zero at the start), all else as `--vertical-drafter recurrent
--loss kl` trains it; the control is the same drafter without W_f, on the same images, seeds and steps. Both are
scored by held-out teacher-forced acceptance, 1 - TV(p, q), as `--eval-images` scores them.

    python docs/probes/layer_features.py --data-dir runs/data8k --prompts runs/prompts8k.txt \
        --out docs/logs/layer_features_probe.json

Result (docs/drafters.md, "Features from more than the last layer"): 0.4746 -> 0.4792 with layers 2 and 4 of 6,
from a first draft of this script (the same drafters, data, seeds and steps; it kept its features in one tensor
file); this tidied version was run end to end on one shard only.
"""

import argparse
import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn
from tqdm import trange

from ssd_pipelines import SSDAutoregressivePipeline
from ssd_pipelines.decoding.block import Block
from ssd_pipelines.decoding.run import both_branches
from ssd_pipelines.heads import DraftHeads
from ssd_pipelines.sampling_config import SamplingConfig
from ssd_pipelines.training.head_loss import HeadLosses
from ssd_pipelines.training.teacher_forcing import draft_below_teacher_forced


def middle_layer_states(backbone, prompts: list[str], codes: torch.Tensor, layers: list[int]) -> torch.Tensor:
    """The outputs of `layers` predicting each cell of AR's grids codes [B, R, C] -> [B, 2, R, C, d * len(layers)]
    (guidance branches as the collection stores them), from one teacher-forced pass."""
    captured = {}
    hooks = [
        backbone.decoder.layers[i].register_forward_hook(
            lambda _m, _a, out, i=i: captured.__setitem__(i, out[0] if isinstance(out, tuple) else out)
        )
        for i in layers
    ]
    try:
        grid = backbone.grid
        batch = backbone.encode_prompts(prompts, guidance=True)
        with torch.no_grad():
            state, _ = backbone.prefill(batch)
            before = {i: captured[i][:, -1] for i in layers}
            block = Block(grid, 0, grid.num_cells)
            backbone.extend(state, block.embed(backbone, both_branches(codes.long().flatten(1), True)))
            states = [block.predicting_hidden(before[i], captured[i]) for i in layers]
    finally:
        for hook in hooks:
            hook.remove()
    states = torch.cat(states, dim=-1).unflatten(1, (grid.rows, grid.cols))
    return states.unflatten(0, (2, -1)).transpose(0, 1)


class Drafter(nn.Module):
    """The recurrent row drafter, reading h' = h + W_f [middle layers] of the row above when `fused`."""

    def __init__(self, hidden_size: int, codebook_size: int, extra: int, fused: bool):
        super().__init__()
        torch.manual_seed(0)  # the same drafter weights with and without W_f
        self.heads = DraftHeads(
            hidden_size,
            hidden_size,
            codebook_size,
            horizontal_offsets=(),
            vertical_offsets=(1,),
            vertical_drafter="recurrent",
        )
        self.fuse = nn.Linear(extra, hidden_size, bias=False) if fused else None
        if self.fuse is not None:
            nn.init.zeros_(self.fuse.weight)

    def forward(self, hidden, extra, embeds):
        """hidden [b, 2, R, C, d], extra [b, 2, R, C, d'], embeds [b, R, C, d] -> the rows below rows 0..R-2."""
        above = hidden[:, :, :-1] if self.fuse is None else hidden[:, :, :-1] + self.fuse(extra[:, :, :-1])
        branches = lambda e: e.unsqueeze(1).expand(-1, 2, -1, -1, -1)
        return draft_below_teacher_forced(
            self.heads, above, branches(embeds[:, :-1]), branches(embeds[:, 1:]), hidden[:, :, 1:]
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--prompts", type=Path, required=True)
    p.add_argument("--shards", type=int, default=36, help="64-image shards read (36: 2,304 images)")
    p.add_argument("--layers", default="1,3", help="0-based decoder layers fused beside the last (of 6)")
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--heldout", type=int, default=256)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    layers = [int(x) for x in args.layers.split(",")]

    backbone = SSDAutoregressivePipeline.from_pretrained("hub_cards/ssd-reference").image_backbone
    sampling = SamplingConfig(guidance_scale=3.0)
    captions = args.prompts.read_text().splitlines()
    hidden, extra, codes = [], [], []
    for index in trange(args.shards, desc="middle layers", unit="shard"):
        shard = load_file(args.data_dir / "process-0" / f"batch-{index:05d}.safetensors")
        prompts = captions[64 * index : 64 * (index + 1)]
        extra.append(middle_layer_states(backbone, prompts, shard["codes"], layers).half())
        hidden.append(shard["hidden"])
        codes.append(shard["codes"])
    hidden, extra, codes = torch.cat(hidden), torch.cat(extra), torch.cat(codes)
    with torch.no_grad():
        embeds = backbone.embed_codes(codes.long())
    trained = len(codes) - args.heldout

    results = {}
    for fused in (False, True):
        drafter = Drafter(backbone.hidden_size, backbone.grid.codebook_size, extra.shape[-1], fused)
        kl = HeadLosses(drafter.heads, "kl", backbone, sampling)
        tv = HeadLosses(drafter.heads, "tv", backbone, sampling)
        optimizer = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
        cosine = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * s / args.steps)))
        generator = torch.Generator().manual_seed(0)
        for _ in trange(args.steps, desc="fused" if fused else "last layer", unit="step"):
            i = torch.randint(trained, (8,), generator=generator)
            h = hidden[i].float()
            loss = kl._compare(drafter(h, extra[i].float(), embeds[i]), h[:, :, 1:])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            cosine.step()
        with torch.no_grad():
            distance = 0.0
            for start in range(trained, len(codes), 16):
                i = slice(start, start + 16)
                h = hidden[i].float()
                distance += tv._compare(drafter(h, extra[i].float(), embeds[i]), h[:, :, 1:]).item() * len(h)
        results["fused" if fused else "last layer"] = round(1 - distance / args.heldout, 4)
    results |= {"layers": layers, "shards": args.shards, "steps": args.steps, "heldout": args.heldout}
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(results)


if __name__ == "__main__":
    main()
