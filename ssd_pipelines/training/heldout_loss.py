"""Held-out next-code loss of reference backbones, split into object cells and background cells.

Adherence needs the objects right, but most cells of an image are textured
background, so the loss over a whole image says little about the objects.
Splitting it shows which part a training run improved.

    python -m ssd_pipelines.training.heldout_loss runs/backbone/backbone runs/backbone2/backbone --vq runs/vq
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from diffusers import VQModel
from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

from ..backbones import GridTokens
from ..reference.caption_tokenizer import build_caption_tokenizer
from ..reference.scenes import HELDOUT_SEED_START, SceneSpec, sample_scene
from .backbone import image_nll, indices_by_length, load_llama_model, reference_grid_tokens, training_batch
from .encoded_scenes import EncodedScenes, encode_scenes


def object_cells(spec: SceneSpec, tokens: GridTokens) -> np.ndarray:
    """Boolean [rows, cols]: the code cells that overlap a rendered object's bounding box."""
    cells = np.zeros((tokens.rows, tokens.cols), dtype=bool)
    side = tokens.pixels_per_code
    for obj in spec.rendered:
        x0, y0, x1, y1 = obj.box  # pixel bounds, end exclusive
        cells[max(0, y0 // side) : -(-y1 // side), max(0, x0 // side) : -(-x1 // side)] = True
    return cells


@torch.no_grad()
def code_losses(
    model: LlamaForCausalLM, data: EncodedScenes, tokens: GridTokens, tokenizer: PreTrainedTokenizerBase
) -> torch.Tensor:
    """Next-token loss of every image code, [N, rows, cols] (EOL and EOI left out)."""
    losses = torch.empty(len(data.captions), tokens.rows, tokens.cols)
    never = np.random.default_rng(0)  # dropout 0: every caption is kept
    for index in indices_by_length(data.captions):
        ids, boi = training_batch(data, index, tokens, tokenizer.bos_token_id, tokenizer.pad_token_id, 0.0, never)
        rows = image_nll(model, ids, boi)[:, :-1].view(len(index), tokens.rows, tokens.cols + 1)
        losses[torch.from_numpy(index)] = rows[..., : tokens.cols]
    return losses


def split_losses(losses: torch.Tensor, objects: np.ndarray) -> dict[str, float]:
    """Mean loss over object cells, background cells and all cells."""
    mask = torch.from_numpy(objects)
    return {
        "object": losses[mask].mean().item(),
        "background": losses[~mask].mean().item(),
        "all": losses.mean().item(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backbones", nargs="+", type=Path, help="saved LlamaForCausalLM folders")
    parser.add_argument("--vq", required=True, type=Path, help="the VQModel folder the backbones were trained on")
    parser.add_argument("--scenes", type=int, default=256, help="held-out scenes to score")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = build_caption_tokenizer()
    vq = VQModel.from_pretrained(args.vq, use_safetensors=True).float().eval()
    tokens = reference_grid_tokens(tokenizer, vq.config.num_vq_embeddings)
    seeds = range(HELDOUT_SEED_START, HELDOUT_SEED_START + args.scenes)
    data = encode_scenes(vq, tokenizer, seeds)
    objects = np.stack([object_cells(sample_scene(seed).spec, tokens) for seed in seeds])
    print(f"Held-out loss (nats per code) on {args.scenes} scenes; {objects.mean():.0%} of cells touch an object.\n")
    print("| backbone | object cells | background cells | all cells |\n|---|---|---|---|")
    for folder in args.backbones:
        model = load_llama_model(folder, tokens).eval()
        split = split_losses(code_losses(model, data, tokens, tokenizer), objects)
        print(f"| {folder} | {split['object']:.3f} | {split['background']:.3f} | {split['all']:.3f} |")


if __name__ == "__main__":
    main()
